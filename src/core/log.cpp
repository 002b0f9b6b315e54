#include "ltrain/core/log.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "ltrain/core/files.h"

namespace ltrain::log {
namespace {

constexpr const char* kPattern = "[%H:%M:%S] %^%l%$ %v";

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

/// The fields a JsonFields on this thread adds to the JSON console's objects.
thread_local nlohmann::json t_json_fields = nlohmann::json::object();

/// The console as JSON objects on stdout, one a line: {"time", "level", "message"} and the fields
/// of the JSON fields in scope where the message was logged. Each line reaches stdout before the
/// call returns; the first write stdout refuses (a closed pipe, a full disk) is kept, and from then
/// on warnings and errors go to stderr as text, where they can still be read.
class JsonConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  JsonConsoleSink() { set_pattern_(kPattern); }

  std::optional<files::WriteError> failure() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    if (failure_) {
      if (message.level < spdlog::level::warn) return;
      spdlog::memory_buf_t formatted;
      formatter_->format(message, formatted);
      std::fwrite(formatted.data(), 1, formatted.size(), stderr);
      std::fflush(stderr);
      return;
    }
    const auto seconds = std::chrono::system_clock::to_time_t(message.time);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(message.time.time_since_epoch()).count() % 1000;
    std::tm utc{};
    ::gmtime_r(&seconds, &utc);
    char date_time[32];
    std::strftime(date_time, sizeof date_time, "%Y-%m-%dT%H:%M:%S", &utc);
    nlohmann::json object{{"time", fmt::format("{}.{:03d}Z", date_time, millis)},
                          {"level", std::string(spdlog::level::to_string_view(message.level).data(),
                                                spdlog::level::to_string_view(message.level).size())},
                          {"message", std::string(message.payload.data(), message.payload.size())}};
    object.update(t_json_fields);
    // Invalid UTF-8 in a message (a path's bytes) is replaced rather than failing the line.
    const std::string line = object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    errno = 0;
    if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size() || std::fflush(stdout) != 0) {
      const int error_number = errno;
      failure_ = files::WriteError(fmt::format("cannot write to standard output ({})",
                                               error_number != 0 ? std::strerror(error_number) : "a write failed"));
      std::clearerr(stdout);
    }
  }
  void flush_() override {
    if (!failure_) std::fflush(stdout);
  }

 private:
  std::optional<files::WriteError> failure_;
};

std::shared_ptr<spdlog::sinks::dist_sink_mt> g_sinks;
std::shared_ptr<spdlog::sinks::sink> g_console_sink;
std::shared_ptr<JsonConsoleSink> g_json_sink;  // the console sink while it is the JSON one
std::shared_ptr<CheckedFileSink> g_file_sink;
bool g_json_console = false;

}  // namespace

bool color_allowed() {
  const char* no_color = std::getenv("NO_COLOR");
  return no_color == nullptr || *no_color == '\0';
}

void init_console(bool verbose) {
  g_sinks = std::make_shared<spdlog::sinks::dist_sink_mt>();
  // Colours only on a terminal, and never under NO_COLOR (https://no-color.org).
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(
      color_allowed() ? spdlog::color_mode::automatic : spdlog::color_mode::never);
  console->set_pattern(kPattern);
  g_console_sink = console;
  g_json_sink.reset();
  g_json_console = false;
  g_sinks->add_sink(console);
  auto logger = std::make_shared<spdlog::logger>("ltrain", g_sinks);
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void use_json_console() {
  if (!g_sinks) init_console(false);
  if (g_json_console) return;
  g_sinks->remove_sink(g_console_sink);
  g_json_sink = std::make_shared<JsonConsoleSink>();
  g_console_sink = g_json_sink;
  g_sinks->add_sink(g_console_sink);
  g_json_console = true;
}

bool json_console() { return g_json_console; }

std::optional<files::WriteError> console_failure() {
  return g_json_sink ? g_json_sink->failure() : std::nullopt;
}

JsonFields::JsonFields(const nlohmann::json& fields) : saved_(t_json_fields) { t_json_fields.update(fields); }

JsonFields::~JsonFields() { t_json_fields = std::move(saved_); }

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
