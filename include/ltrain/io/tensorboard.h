#pragma once
// TensorBoard event files, written without protobuf: the few messages ltrain needs (Event with
// wall_time, step and file_version or a Summary; Summary values that are scalars, or strings for
// the "text" plugin) encoded by hand from TensorBoard's event.proto, summary.proto and
// tensor.proto, each Event framed as a TFRecord. A file is named events.out.tfevents.<seconds>.<host>.ltrain,
// which TensorBoard's loader finds (it reads the files whose names hold "tfevents").
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ltrain/core/files.h"

namespace ltrain::io {

/// CRC-32C (Castagnoli's polynomial, reflected: 0x82F63B78), as TFRecord uses it.
uint32_t crc32c(const void* data, size_t size);

/// TFRecord's masked CRC (rotated right by 15 bits, plus 0xA282EAD8), so that a CRC of data that
/// holds CRCs stays well distributed.
uint32_t masked_crc32c(uint32_t crc);

/// `payload` as one TFRecord: its length (uint64, little-endian), the masked CRC-32C of those 8
/// bytes, the payload, the masked CRC-32C of the payload.
std::string tfrecord(std::string_view payload);

/// Scalars (tag, value) of one step, each a Summary.Value's simple_value (float32).
using Scalars = std::vector<std::pair<std::string, double>>;
/// Texts (tag, Markdown) of one step, each a string tensor for the "text" plugin.
using Texts = std::vector<std::pair<std::string, std::string>>;

/// Serialized Event messages (without the TFRecord framing). `wall_time` is seconds since the epoch.
std::string file_version_event(double wall_time);  ///< file_version "brain.Event:2": a file's first record
std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars);
std::string texts_event(double wall_time, int64_t step, const Texts& texts);

/// A TFRecord of an Event, as read back for keeping or dropping it.
struct EventRecord {
  std::string framed;     ///< the whole record, framing included
  int64_t step = 0;       ///< Event.step
  std::string first_tag;  ///< the tag of its summary's first value ("" without a summary)
};

/// The whole records of the event file `file` in order: bytes that start none (the end of a write
/// that was cut off, or a record whose framing or CRCs fail) are passed over up to the next whole
/// record, so that a damaged record loses only itself; `complete` is false when any were.
std::vector<EventRecord> read_event_records(const std::filesystem::path& file, bool& complete);

/// True for the names of the event files ltrain writes: events.out.tfevents.*.ltrain.
bool is_ltrain_event_file(const std::string& file_name);

/// Rewrites every ltrain event file in `run_dir` with the records `keep` accepts (and the
/// file_version records, which have no summary), dropping a torn end and damaged records; a file is left
/// untouched when all its records stay. WriteError when a file cannot be rewritten.
void filter_event_files(const std::filesystem::path& run_dir, const std::function<bool(const EventRecord&)>& keep);

/// RUN_DIR/events.out.tfevents.<seconds now, 10 digits>.<host>.ltrain: the name of the event file
/// a process that starts now writes.
std::filesystem::path new_event_file_name(const std::filesystem::path& run_dir);

/// An event file that each call appends to with write(2): in the file when the call returns.
/// WriteError naming the file at the first write the system refuses.
class EventFile {
 public:
  /// Opens `file` for appending; an empty or new file first gets its file_version record (a file
  /// of the same name, a run that started in the same second, is continued).
  explicit EventFile(const std::filesystem::path& file);

  void write_scalars(int64_t step, const Scalars& scalars);
  void write_texts(int64_t step, const Texts& texts);
  const std::filesystem::path& path() const { return file_.path(); }

 private:
  files::AppendFile file_;
};

}  // namespace ltrain::io
