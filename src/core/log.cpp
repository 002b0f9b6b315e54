#include "ltrain/core/log.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "ltrain/core/files.h"

namespace ltrain::log {
namespace {

/// A log file that writes each message with write(2) and keeps the first failure, where spdlog's
/// basic_file_sink buffers, and reports a failed write on stderr only.
class CheckedFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CheckedFileSink(const std::filesystem::path& file) : file_(file) {}

  /// The first write that failed, if any.
  std::optional<files::WriteError> failure() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    if (failure_) return;
    spdlog::memory_buf_t formatted;
    formatter_->format(message, formatted);
    try {
      file_.append(std::string_view(formatted.data(), formatted.size()));
    } catch (const files::WriteError& error) {
      failure_ = error;
    }
  }
  void flush_() override {}  // nothing is buffered

 private:
  files::AppendFile file_;
  std::optional<files::WriteError> failure_;
};

constexpr const char* kPattern = "[%H:%M:%S] %^%l%$ %v";
std::shared_ptr<spdlog::sinks::dist_sink_mt> g_sinks;
std::shared_ptr<CheckedFileSink> g_file_sink;

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
  g_file_sink = std::make_shared<CheckedFileSink>(file);
  g_file_sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %l %v");
  g_sinks->add_sink(g_file_sink);
}

void throw_if_file_failed() {
  if (!g_file_sink) return;
  if (std::optional<files::WriteError> failure = g_file_sink->failure()) throw *failure;
}

void remove_file() {
  if (!g_sinks || !g_file_sink) return;
  g_sinks->remove_sink(g_file_sink);
  g_file_sink.reset();
}

}  // namespace ltrain::log
