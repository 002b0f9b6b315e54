#include "ltrain/core/log.h"

#include <memory>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace ltrain::log {
namespace {
constexpr const char* kPattern = "[%H:%M:%S] %^%l%$ %v";
std::shared_ptr<spdlog::sinks::dist_sink_mt> g_sinks;
std::shared_ptr<spdlog::sinks::sink> g_file_sink;
}  // namespace

void init_console(bool verbose) {
  g_sinks = std::make_shared<spdlog::sinks::dist_sink_mt>();
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_pattern(kPattern);
  g_sinks->add_sink(console);
  auto logger = std::make_shared<spdlog::logger>("ltrain", g_sinks);
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void add_file(const std::filesystem::path& file) {
  if (!g_sinks) init_console(false);
  remove_file();
  g_file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file.string(), /*truncate=*/false);
  g_file_sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %l %v");
  g_sinks->add_sink(g_file_sink);
}

void remove_file() {
  if (!g_sinks || !g_file_sink) return;
  g_file_sink->flush();
  g_sinks->remove_sink(g_file_sink);
  g_file_sink.reset();
}

}  // namespace ltrain::log
