#include "ltrain/io/tensorboard.h"

#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <system_error>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/io/provenance.h"

namespace ltrain::io {
namespace fs = std::filesystem;
namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[byte] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table();

// ---- Protocol buffer wire format: the pieces the messages below need ----
// Wire types: 0 varint, 1 fixed 64 bits, 2 length-delimited, 5 fixed 32 bits.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

void put_little_endian(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void put_varint_field(std::string& out, uint32_t field, uint64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, value);
}

void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void put_double_field(std::string& out, uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float_field(std::string& out, uint32_t field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

// Field numbers, from TensorBoard's compat/proto files.
namespace event {
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
}
namespace summary {
constexpr uint32_t kValue = 1;  // Summary.value (repeated)
constexpr uint32_t kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9;  // Summary.Value
}
namespace metadata {
constexpr uint32_t kPluginData = 1, kDataClass = 4;  // SummaryMetadata
constexpr uint32_t kPluginName = 1;                  // SummaryMetadata.PluginData
constexpr uint64_t kDataClassTensor = 2;             // DataClass.DATA_CLASS_TENSOR
}
namespace tensor {
constexpr uint32_t kDtype = 1, kTensorShape = 2, kStringVal = 8;  // TensorProto
constexpr uint64_t kDtypeString = 7;                              // DataType.DT_STRING
}

/// An Event with its wall time and step (left out at 0, as proto3 writes it), then `what`: one
/// field of the `what` oneof, already encoded.
std::string event_message(double wall_time, int64_t step, const std::string& what) {
  std::string out;
  put_double_field(out, event::kWallTime, wall_time);
  if (step != 0) put_varint_field(out, event::kStep, static_cast<uint64_t>(step));
  return out + what;
}

/// Event.summary holding `values` (each an encoded Summary.Value).
std::string summary_field(const std::vector<std::string>& values) {
  std::string summary_message;
  for (const std::string& value : values) put_bytes_field(summary_message, summary::kValue, value);
  std::string out;
  put_bytes_field(out, event::kSummary, summary_message);
  return out;
}

// ---- Reading back what the encoders above write ----

/// A cursor over a message's bytes; each read returns false past the end or on a malformed field.
struct Reader {
  const unsigned char* at;
  const unsigned char* end;

  bool varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && at < end; shift += 7) {
      const unsigned char byte = *at++;
      value |= uint64_t{byte & 0x7Fu} << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  }
  /// The next field's number and type, and its bytes in `body` when it is length-delimited.
  bool field(uint32_t& number, uint64_t& varint_value, std::string_view& body) {
    uint64_t key = 0;
    if (!varint(key)) return false;
    number = static_cast<uint32_t>(key >> 3);
    switch (key & 7) {
      case kVarint:
        return varint(varint_value);
      case kFixed64:
        return skip(8);
      case kFixed32:
        return skip(4);
      case kLengthDelimited: {
        uint64_t length = 0;
        if (!varint(length) || length > static_cast<uint64_t>(end - at)) return false;
        body = std::string_view(reinterpret_cast<const char*>(at), static_cast<size_t>(length));
        at += length;
        return true;
      }
      default:
        return false;
    }
  }
  bool skip(size_t bytes) {
    if (static_cast<size_t>(end - at) < bytes) return false;
    at += bytes;
    return true;
  }
  static Reader of(std::string_view bytes) {
    const auto* begin = reinterpret_cast<const unsigned char*>(bytes.data());
    return {begin, begin + bytes.size()};
  }
};

/// The length-delimited field `wanted` of `message` (the first one), or false.
bool first_bytes_field(std::string_view message, uint32_t wanted, std::string_view& out) {
  Reader reader = Reader::of(message);
  while (reader.at < reader.end) {
    uint32_t number = 0;
    uint64_t ignored = 0;
    std::string_view body;
    if (!reader.field(number, ignored, body)) return false;
    if (number == wanted && !body.empty()) {
      out = body;
      return true;
    }
  }
  return false;
}

/// An Event's step and the tag of its summary's first value; false when it does not parse.
bool parse_event(std::string_view message, EventRecord& record) {
  Reader reader = Reader::of(message);
  std::string_view summary_message;
  while (reader.at < reader.end) {
    uint32_t number = 0;
    uint64_t value = 0;
    std::string_view body;
    if (!reader.field(number, value, body)) return false;
    if (number == event::kStep) record.step = static_cast<int64_t>(value);
    if (number == event::kSummary) summary_message = body;
  }
  std::string_view first_value, tag;
  if (first_bytes_field(summary_message, summary::kValue, first_value) &&
      first_bytes_field(first_value, summary::kTag, tag))
    record.first_tag = std::string(tag);
  return true;
}

uint64_t little_endian(const unsigned char* bytes, int count) {
  uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr const char* kEventFilePrefix = "events.out.tfevents.";
constexpr const char* kEventFileSuffix = ".ltrain";

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

std::string tfrecord(std::string_view payload) {
  std::string out;
  put_little_endian(out, payload.size(), 8);
  put_little_endian(out, masked_crc32c(crc32c(out.data(), 8)), 4);
  out.append(payload.data(), payload.size());
  put_little_endian(out, masked_crc32c(crc32c(payload.data(), payload.size())), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  std::string what;
  put_bytes_field(what, event::kFileVersion, "brain.Event:2");
  return event_message(wall_time, 0, what);
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars) {
  std::vector<std::string> values;
  for (const auto& [tag, number] : scalars) {
    std::string value;
    put_bytes_field(value, summary::kTag, tag);
    put_float_field(value, summary::kSimpleValue, static_cast<float>(number));
    values.push_back(value);
  }
  return event_message(wall_time, step, summary_field(values));
}

std::string texts_event(double wall_time, int64_t step, const Texts& texts) {
  // The text plugin's metadata (plugin "text", its content empty: version 0) and a scalar string tensor.
  std::string plugin_data, meta, tensor_message;
  put_bytes_field(plugin_data, metadata::kPluginName, "text");
  put_bytes_field(meta, metadata::kPluginData, plugin_data);
  put_varint_field(meta, metadata::kDataClass, metadata::kDataClassTensor);
  std::vector<std::string> values;
  for (const auto& [tag, text] : texts) {
    std::string tensor_field;
    put_varint_field(tensor_field, tensor::kDtype, tensor::kDtypeString);
    put_bytes_field(tensor_field, tensor::kTensorShape, "");  // no dimensions: a scalar
    put_bytes_field(tensor_field, tensor::kStringVal, text);
    std::string value;
    put_bytes_field(value, summary::kTag, tag);
    put_bytes_field(value, summary::kMetadata, meta);
    put_bytes_field(value, summary::kTensor, tensor_field);
    values.push_back(value);
  }
  return event_message(wall_time, step, summary_field(values));
}

namespace {

/// The record that starts at `at` (before `end`) into `record`, true where its framing, both CRCs
/// and its Event message are whole.
bool record_at(const unsigned char* at, const unsigned char* end, EventRecord& record) {
  if (end - at < 16) return false;
  const uint64_t length = little_endian(at, 8);
  if (masked_crc32c(crc32c(at, 8)) != little_endian(at + 8, 4)) return false;
  if (length > static_cast<uint64_t>(end - at) - 16) return false;
  const std::string_view payload(reinterpret_cast<const char*>(at + 12), static_cast<size_t>(length));
  if (masked_crc32c(crc32c(payload.data(), payload.size())) != little_endian(at + 12 + length, 4)) return false;
  if (!parse_event(payload, record)) return false;
  record.framed.assign(reinterpret_cast<const char*>(at), static_cast<size_t>(length) + 16);
  return true;
}

}  // namespace

std::vector<EventRecord> read_event_records(const fs::path& file, bool& complete) {
  constexpr size_t kMaxEventFileBytes = size_t{1} << 30;
  const files::TextRead read = files::read_regular_file(file, kMaxEventFileBytes);
  if (!read.problem.empty())
    throw RunError(fmt::format("{}: {}; move it out of the run folder", file.string(), read.problem));
  std::vector<EventRecord> records;
  const auto* at = reinterpret_cast<const unsigned char*>(read.text.data());
  const auto* end = at + read.text.size();
  complete = true;
  while (at < end) {
    EventRecord record;
    if (record_at(at, end, record)) {
      at += record.framed.size();
      records.push_back(std::move(record));
      continue;
    }
    // Bytes that start no whole record: a write cut off at the end, or a damaged stretch, after
    // which reading goes on at the next whole record (the one a byte-by-byte search finds), so
    // that damage costs only the records it hit.
    complete = false;
    EventRecord scratch;
    do {
      ++at;
    } while (at < end && !record_at(at, end, scratch));
  }
  return records;
}

bool is_ltrain_event_file(const std::string& file_name) {
  const std::string prefix = kEventFilePrefix, suffix = kEventFileSuffix;
  return file_name.size() > prefix.size() + suffix.size() && file_name.compare(0, prefix.size(), prefix) == 0 &&
         file_name.compare(file_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void filter_event_files(const fs::path& run_dir, const std::function<bool(const EventRecord&)>& keep) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir, error)) {
    if (!entry.is_regular_file(error) || !is_ltrain_event_file(entry.path().filename().string())) continue;
    bool complete = true;
    const std::vector<EventRecord> records = read_event_records(entry.path(), complete);
    std::string kept;
    bool dropped = !complete;
    for (const EventRecord& record : records) {
      if (record.first_tag.empty() || keep(record)) {
        kept += record.framed;
      } else {
        dropped = true;
      }
    }
    if (dropped) files::write_atomically(entry.path(), {{kept.data(), kept.size()}});
  }
}

fs::path new_event_file_name(const fs::path& run_dir) {
  // Ten digits, as TensorBoard's own writers pad the seconds: the names sort by time.
  return run_dir / fmt::format("{}{:010d}.{}{}", kEventFilePrefix, static_cast<long long>(std::time(nullptr)),
                               host_name(), kEventFileSuffix);
}

EventFile::EventFile(const fs::path& file) : file_(file) {
  // A new file starts with its file_version record; one of the same second goes on after its own.
  std::error_code error;
  if (fs::file_size(file_.path(), error) == 0 || error) file_.append(tfrecord(file_version_event(seconds_now())));
}

void EventFile::write_scalars(int64_t step, const Scalars& scalars) {
  if (!scalars.empty()) file_.append(tfrecord(scalars_event(seconds_now(), step, scalars)));
}

void EventFile::write_texts(int64_t step, const Texts& texts) {
  if (!texts.empty()) file_.append(tfrecord(texts_event(seconds_now(), step, texts)));
}

}  // namespace ltrain::io
