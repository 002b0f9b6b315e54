#include "ltrain/core/files.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ltrain::files {
namespace {

/// What a stat() result that is not a regular file is, as "is a ..., not a file".
std::string describe_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory, not a file";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a file";
  if (S_ISCHR(mode)) return "is a character device, not a file";
  if (S_ISBLK(mode)) return "is a block device, not a file";
  if (S_ISSOCK(mode)) return "is a socket, not a file";
  return "is not a regular file";
}

/// Why stat() or open() failed with `error`, in the same words.
std::string describe_errno(int error) {
  switch (error) {
    case ENOENT: return "no such file";
    case ENOTDIR: return "no such file (a part of its path is a file, not a folder)";
    case ENAMETOOLONG: return "its name is too long";
    case EACCES: return "permission denied";
    case ELOOP: return "its symbolic links loop";
    default: return std::strerror(error);
  }
}

/// `bytes` as "4 MiB" when it is a whole number of MiB, else as "1000 bytes".
std::string describe_size(std::size_t bytes) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  return bytes % kMiB == 0 ? std::to_string(bytes / kMiB) + " MiB" : std::to_string(bytes) + " bytes";
}

}  // namespace

std::string not_a_regular_file(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return describe_errno(errno);
  return S_ISREG(info.st_mode) ? "" : describe_kind(info.st_mode);
}

std::string not_writable_as_regular_file(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return errno == ENOENT ? "" : describe_errno(errno);
  return S_ISREG(info.st_mode) ? "" : describe_kind(info.st_mode);
}

TextRead read_regular_file(const std::filesystem::path& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer; the
  // descriptor's own fstat() then says what was opened, whatever the path pointed to before.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {"", describe_errno(errno)};
  TextRead result;
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    result.problem = describe_errno(errno);
  } else if (!S_ISREG(info.st_mode)) {
    result.problem = describe_kind(info.st_mode);
  } else {
    char buffer[65536];
    while (result.problem.empty()) {
      const ssize_t got = ::read(fd, buffer, sizeof buffer);
      if (got == 0) break;
      if (got < 0) {
        if (errno == EINTR) continue;
        result.problem = std::string("cannot be read (") + std::strerror(errno) + ")";
      } else if (result.text.size() + static_cast<std::size_t>(got) > max_bytes) {
        result.problem = "is larger than " + describe_size(max_bytes);
      } else {
        result.text.append(buffer, static_cast<std::size_t>(got));
      }
    }
  }
  ::close(fd);
  if (!result.problem.empty()) result.text.clear();
  return result;
}

}  // namespace ltrain::files
