#pragma once
// Logging through spdlog: the console and, once a run directory exists, a log file in it. Each
// message reaches the log file before the logging call returns; a write the system refuses is
// kept (spdlog would only print it and go on) for throw_if_file_failed.
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ltrain/core/files.h"

namespace ltrain::log {

/// Console logging with ltrain's pattern, the level in colour on a terminal unless NO_COLOR is
/// set (https://no-color.org); call once at start.
void init_console(bool verbose);

/// False when the environment variable NO_COLOR is set and not empty: no colours in the console
/// log (the progress bar has none).
bool color_allowed();

/// The console log as JSON objects on stdout, one a line, in place of text on stderr (train
/// --json): {"time": "2026-12-02T15:20:08.123Z" (UTC), "level": "info", "message": "..."} and the
/// fields of the JsonFields in scope where the message was logged (a progress line's step, loss,
/// lr, ...). The log file keeps its text.
void use_json_console();

/// Whether use_json_console was called (since the last init_console).
bool json_console();

/// The first write of the JSON console that standard output refused (a pipe whose reader is gone,
/// a full disk: "cannot write to standard output (Broken pipe)"), if any. The console's lines
/// reach stdout before each logging call returns, so this holds from the first line lost; the
/// training loop stops on it as on a signal, with a checkpoint (exit code 4).
std::optional<files::WriteError> console_failure();

/// Fields the JSON console adds to the messages logged on this thread while it lives.
class JsonFields {
 public:
  explicit JsonFields(const nlohmann::json& fields);
  ~JsonFields();
  JsonFields(const JsonFields&) = delete;
  JsonFields& operator=(const JsonFields&) = delete;

 private:
  nlohmann::json saved_;
};

/// Also write every message to `file` (appending), e.g. RUN_DIR/train.log. files::WriteError
/// naming the file when it cannot be opened.
void add_file(const std::filesystem::path& file);

/// files::WriteError naming the log file when a message could not be written to it since
/// add_file (disk full, a file-size limit); from then on messages go to the console only.
void throw_if_file_failed();

/// Stop writing to the log file.
void remove_file();

}  // namespace ltrain::log
