#pragma once
// Logging through spdlog: the console and, once a run directory exists, a log file in it.
#include <filesystem>

#include <spdlog/spdlog.h>

namespace ltrain::log {

/// Console logging with ltrain's pattern; call once at start.
void init_console(bool verbose);

/// Also write every message to `file` (appending), e.g. RUN_DIR/train.log.
void add_file(const std::filesystem::path& file);

/// Stop writing to the log file (flushes it).
void remove_file();

}  // namespace ltrain::log
