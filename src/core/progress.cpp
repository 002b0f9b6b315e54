#include "ltrain/core/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/core/log.h"

namespace ltrain {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
  if (total >= 60) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

size_t terminal_columns() {
  constexpr size_t kFallbackColumns = 80;
  winsize size{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    char* end = nullptr;
    const long value = std::strtol(columns, &end, 10);
    if (end != columns && *end == '\0' && value > 0 && value < 100000) return static_cast<size_t>(value);
  }
  return kFallbackColumns;
}

std::string progress_line(const ProgressState& s, size_t columns) {
  constexpr int kBarWidth = 24;
  const double fraction =
      s.epoch_steps > 0 ? static_cast<double>(s.epoch_step) / static_cast<double>(s.epoch_steps) : 0.0;
  const int filled = std::clamp(static_cast<int>(fraction * kBarWidth), 0, kBarWidth);
  const std::vector<std::string> fields{
      fmt::format("epoch {}/{} [{}{}] {}/{}", s.epoch, s.epochs, std::string(static_cast<size_t>(filled), '#'),
                  std::string(static_cast<size_t>(kBarWidth - filled), '.'), s.epoch_step, s.epoch_steps),
      fmt::format("loss {:.4f} acc {:5.1f}%", s.loss, 100.0 * s.accuracy),
      fmt::format("lr {:.4g}", s.lr),
      fmt::format("{:.0f} img/s", s.images_per_second),
      fmt::format("eta {}", format_duration(s.eta_seconds))};
  const size_t width = columns > 1 ? columns - 1 : 0;
  std::string line = fields.front().substr(0, width);
  for (size_t i = 1; i < fields.size(); ++i) {
    if (line.size() + 3 + fields[i].size() > width) break;
    line += " | " + fields[i];
  }
  return line;
}

void Progress::update(const ProgressState& s) {
  if (!on_terminal_) {
    const log::JsonFields fields({{"event", "progress"},
                                  {"epoch", s.epoch},
                                  {"epochs", s.epochs},
                                  {"step", s.step},
                                  {"total_steps", s.total_steps},
                                  {"loss", s.loss},
                                  {"accuracy", s.accuracy},
                                  {"lr", s.lr},
                                  {"images_per_second", s.images_per_second},
                                  {"eta_seconds", s.eta_seconds}});
    spdlog::info("epoch {}/{} step {}/{} | loss {:.4f} acc {:5.1f}% | lr {:.4g} | {:.0f} img/s | eta {}", s.epoch,
                 s.epochs, s.step, s.total_steps, s.loss, 100.0 * s.accuracy, s.lr, s.images_per_second,
                 format_duration(s.eta_seconds));
    return;
  }
  // The width is read at each update: a resized terminal gets a line that fits it.
  std::fprintf(stderr, "\r\033[2K%s", progress_line(s, terminal_columns()).c_str());
  std::fflush(stderr);
  bar_shown_ = true;
}

void Progress::clear() {
  if (!bar_shown_) return;
  std::fprintf(stderr, "\r\033[2K");
  std::fflush(stderr);
  bar_shown_ = false;
}

}  // namespace ltrain
