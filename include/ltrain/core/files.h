#pragma once
// Files named by users and files ltrain writes. Reading: what kind of file a path is, and bounded
// reads of regular files; a FIFO, a device or a directory given where a file belongs is named as
// such before anything opens it (opening a FIFO waits for a writer; /dev/zero never ends).
// Writing, so that a failure shows when it happens: appends that reach the kernel before they
// return, and whole files written atomically (a temporary FILE.tmp-PID beside the target, fsync,
// rename). A failed write is a WriteError that names the file, the reason (disk full, a file-size
// limit, a read-only folder) and what to do; what was written before stays as it was.
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ltrain/core/errors.h"

namespace ltrain::files {

/// Why `path` cannot be read as a regular file (following links), as a phrase that completes
/// "<path>: ...": "no such file", "is a directory, not a file", "is a FIFO (named pipe), not a
/// file", "its name is too long", ...; "" when it is a regular file.
std::string not_a_regular_file(const std::filesystem::path& path);

/// not_a_regular_file's answer, or, for a regular file, why its first byte cannot be read: "permission
/// denied", "cannot be read (Input/output error): not a file with contents of its own" (a system
/// file such as /proc/self/mem); "" when it can be read.
std::string not_a_readable_file(const std::filesystem::path& path);

/// Why a regular file cannot be written at `path`, in the same words: "" when nothing is there
/// yet or a regular file is; otherwise what is there (a directory, a device, a FIFO) or why the
/// path cannot be looked at.
std::string not_writable_as_regular_file(const std::filesystem::path& path);

/// The contents of a regular file, or why there are none.
struct TextRead {
  std::string text;
  std::string problem;  ///< "" when `text` is the whole file; else a phrase as not_a_regular_file's
};

/// Reads the regular file `path` whole if it holds at most `max_bytes` bytes. Never waits on a
/// FIFO and never reads more than `max_bytes` + 1 bytes.
TextRead read_regular_file(const std::filesystem::path& path, std::size_t max_bytes);

/// A write that the system refused (exit code 4, as every RunError).
class WriteError : public RunError {
 public:
  using RunError::RunError;
};

/// The WriteError for `action` ("write", "open", "rename ...") on `file` failing with errno
/// `error_number`: "FILE: cannot write (No space left on device): free disk space ...".
WriteError write_error(const std::filesystem::path& file, const std::string& action, int error_number);

/// Creates `folder` and its parents for a command's results. ConfigError naming it (`option`, as
/// "--out") and why, when it cannot be made or something other than a folder is there.
void create_results_folder(const std::filesystem::path& folder, const std::string& option);

/// A file opened for appending, written with write(2): no buffer hides a failure.
class AppendFile {
 public:
  /// Opens `file` for appending, creating it. WriteError when it cannot.
  explicit AppendFile(std::filesystem::path file);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  /// Writes all of `text` before returning; WriteError at the first failed write (a part of
  /// `text` may then be in the file).
  void append(std::string_view text);
  const std::filesystem::path& path() const { return file_; }

 private:
  std::filesystem::path file_;
  int descriptor_ = -1;
};

/// Bytes to write: pointer and length.
using Pieces = std::vector<std::pair<const void*, size_t>>;

/// Writes `pieces` into FILE.tmp-PID, fsyncs it and renames it over `file`. WriteError when
/// anything fails; the temporary is then removed and an earlier `file` is untouched.
void write_atomically(const std::filesystem::path& file, const Pieces& pieces);

/// Removes the temporaries write_atomically leaves behind when its process is killed
/// (NAME.tmp-PID in `folder`, PID no longer a process of this host); those of a living process
/// are kept. Returns the removed files.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& folder);

}  // namespace ltrain::files
