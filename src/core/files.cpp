#include "ltrain/core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

namespace ltrain::files {
namespace fs = std::filesystem;

// ---- Reading ----
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

std::string not_a_readable_file(const std::filesystem::path& path) {
  if (std::string problem = not_a_regular_file(path); !problem.empty()) return problem;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return describe_errno(errno);
  char first = 0;
  ssize_t got = 0;
  do got = ::read(fd, &first, 1);
  while (got < 0 && errno == EINTR);
  const int error = errno;
  ::close(fd);
  if (got >= 0) return "";
  return std::string("cannot be read (") + std::strerror(error) + "): not a file with contents of its own";
}

void create_results_folder(const std::filesystem::path& folder, const std::string& option) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error || !std::filesystem::is_directory(folder, error))
    throw ConfigError(fmt::format("{} {}: cannot create this results folder ({}); choose another {}", option,
                                  folder.string(), error ? error.message() : "something else is there", option));
}

std::string not_writable_as_regular_file(const std::filesystem::path& path) {
  if (path.empty()) return "an empty path";
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

// ---- Writing ----
namespace {

constexpr const char* kTemporaryMarker = ".tmp-";

/// What a user can do about a write that failed with `error_number`.
const char* remedy(int error_number) {
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
      return "free some disk space or write to another disk";
    case EFBIG:
      return "raise the file-size limit (ulimit -f) or write elsewhere";
    case EROFS:
    case EACCES:
    case EPERM:
      return "make the folder writable or write to another folder";
    default:
      return "check the disk, or write to another folder";
  }
}

/// Writes all `size` bytes at `data` to `descriptor`; false with errno set when the system refuses.
bool write_all(int descriptor, const void* data, size_t size) {
  const char* cursor = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(descriptor, cursor, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    cursor += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

/// The PID in "NAME.tmp-PID", or 0 when `name` is not such a name.
pid_t temporary_owner(const std::string& name) {
  const size_t marker = name.rfind(kTemporaryMarker);
  if (marker == std::string::npos) return 0;
  const std::string digits = name.substr(marker + std::strlen(kTemporaryMarker));
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return static_cast<pid_t>(std::stol(digits));
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

WriteError write_error(const fs::path& file, const std::string& action, int error_number) {
  return WriteError(
      fmt::format("{}: cannot {} ({}): {}", file.string(), action, std::strerror(error_number), remedy(error_number)));
}

AppendFile::AppendFile(fs::path file) : file_(std::move(file)) {
  descriptor_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (descriptor_ < 0) throw write_error(file_, "open it for writing", errno);
}

AppendFile::~AppendFile() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

void AppendFile::append(std::string_view text) {
  if (!write_all(descriptor_, text.data(), text.size())) throw write_error(file_, "write", errno);
}

void write_atomically(const fs::path& file, const Pieces& pieces) {
  const fs::path temporary = file.string() + kTemporaryMarker + std::to_string(::getpid());
  int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto fail = [&](const char* action) {
    const int error_number = errno;
    if (descriptor >= 0) ::close(descriptor);
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw write_error(file, action, error_number);
  };
  if (descriptor < 0) fail("create it");
  for (const auto& [data, size] : pieces)
    if (!write_all(descriptor, data, size)) fail("write");
  if (::fsync(descriptor) != 0) fail("flush it to disk");
  const int closed = ::close(descriptor);
  descriptor = -1;
  if (closed != 0) fail("close");
  if (std::rename(temporary.c_str(), file.c_str()) != 0) fail("rename its temporary file into place");
}

std::vector<fs::path> remove_stale_temporaries(const fs::path& folder) {
  std::vector<fs::path> removed;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const pid_t owner = temporary_owner(entry.path().filename().string());
    if (owner <= 0 || process_exists(owner)) continue;
    std::error_code ignored;
    if (fs::remove(entry.path(), ignored)) removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace ltrain::files
