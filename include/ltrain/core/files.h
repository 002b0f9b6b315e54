#pragma once
// Files named by users: what kind of file a path is, and bounded reads of regular files. A FIFO,
// a device or a directory given where a file belongs is named as such, before anything opens it
// (opening a FIFO waits for a writer; /dev/zero never ends).
#include <cstddef>
#include <filesystem>
#include <string>

namespace ltrain::files {

/// Why `path` cannot be read as a regular file (following links), as a phrase that completes
/// "<path>: ...": "no such file", "is a directory, not a file", "is a FIFO (named pipe), not a
/// file", "its name is too long", ...; "" when it is a regular file.
std::string not_a_regular_file(const std::filesystem::path& path);

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

}  // namespace ltrain::files
