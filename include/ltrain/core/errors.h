#pragma once
// Typed errors: library code throws, only main() turns them into exit codes.
// A user error carries one line that says what is wrong and what to do.
#include <stdexcept>
#include <string>

namespace ltrain {

/// Process exit codes, the contract with shell scripts and schedulers.
enum class ExitCode : int {
  ok = 0,
  internal = 1,      ///< a bug in ltrain: the message carries file:line context
  usage = 2,         ///< bad flag or config
  data = 3,          ///< missing, truncated or foreign data file
  runtime = 4,       ///< the run failed: non-finite loss, out of memory, unusable device
  peer = 5,          ///< data-parallel run: another process failed, hung, or disagrees
  output_exists = 6, ///< a command's output file exists and --force was not given: nothing written
  points_failed = 7, ///< a sweep ran to its end but some of its points failed (their rows say why)
  cannot_start = 127, ///< the ltrain launcher found no ltrain-core to run (as a shell's "cannot execute")
  interrupted = 130, ///< SIGINT/SIGTERM
};

/// Base of every error a user can act on.
class UserError : public std::runtime_error {
 public:
  UserError(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

/// A bad command-line flag or config value (exit code 2).
class ConfigError : public UserError {
 public:
  explicit ConfigError(const std::string& message) : UserError(ExitCode::usage, message) {}
};

/// A missing, truncated or foreign data or checkpoint file (exit code 3).
class DataError : public UserError {
 public:
  explicit DataError(const std::string& message) : UserError(ExitCode::data, message) {}
};

/// The run cannot go on: non-finite loss, out of memory, an unusable device (exit code 4).
class RunError : public UserError {
 public:
  explicit RunError(const std::string& message) : UserError(ExitCode::runtime, message) {}
};

/// Data-parallel run: another process stopped, hung past distributed.timeout_s, or could not be
/// reached (exit code 5). The message names the rank that saw it and says what to check.
class PeerError : public UserError {
 public:
  explicit PeerError(const std::string& message) : UserError(ExitCode::peer, message) {}
};

/// A command would replace a file that exists and was not told to (--force) (exit code 6).
class OutputExists : public UserError {
 public:
  explicit OutputExists(const std::string& message) : UserError(ExitCode::output_exists, message) {}
};

/// The run stopped on SIGINT/SIGTERM after writing a checkpoint (exit code 130).
class Interrupted : public UserError {
 public:
  explicit Interrupted(const std::string& message) : UserError(ExitCode::interrupted, message) {}
};

}  // namespace ltrain
