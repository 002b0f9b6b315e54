#pragma once
// Logging through spdlog: the console and, once a run directory exists, a log file in it. Each
// message reaches the log file before the logging call returns; a write the system refuses is
// kept (spdlog would only print it and go on) for throw_if_file_failed.
#include <filesystem>

#include <spdlog/spdlog.h>

namespace ltrain::log {

/// Console logging with ltrain's pattern; call once at start.
void init_console(bool verbose);

/// Also write every message to `file` (appending), e.g. RUN_DIR/train.log. files::WriteError
/// naming the file when it cannot be opened.
void add_file(const std::filesystem::path& file);

/// files::WriteError naming the log file when a message could not be written to it since
/// add_file (disk full, a file-size limit); from then on messages go to the console only.
void throw_if_file_failed();

/// Stop writing to the log file.
void remove_file();

}  // namespace ltrain::log
