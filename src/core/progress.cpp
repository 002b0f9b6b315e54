#include "ltrain/core/progress.h"

#include <cmath>
#include <cstdio>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ltrain {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
  if (total >= 60) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

void Progress::update(const ProgressState& s) {
  const std::string numbers =
      fmt::format("loss {:.4f} acc {:5.1f}% | lr {:.4g} | {:.0f} img/s | eta {}", s.loss, 100.0 * s.accuracy, s.lr,
                  s.images_per_second, format_duration(s.eta_seconds));
  if (!on_terminal_) {
    spdlog::info("epoch {}/{} step {}/{} | {}", s.epoch, s.epochs, s.step, s.total_steps, numbers);
    return;
  }
  constexpr int kWidth = 24;
  const double fraction = s.epoch_steps > 0 ? static_cast<double>(s.epoch_step) / static_cast<double>(s.epoch_steps) : 0.0;
  const int filled = static_cast<int>(fraction * kWidth);
  std::fprintf(stderr, "\r\033[2Kepoch %lld/%lld [%s%s] %lld/%lld | %s", static_cast<long long>(s.epoch),
               static_cast<long long>(s.epochs), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), static_cast<long long>(s.epoch_step),
               static_cast<long long>(s.epoch_steps), numbers.c_str());
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
