#include "ltrain/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace ltrain::optim {
namespace {
constexpr double kPi = 3.14159265358979323846;

/// Cosine interpolation from `from` (pct 0) to `to` (pct 1), as PyTorch's OneCycleLR anneals.
double cosine_between(double from, double to, double pct) { return to + (from - to) / 2.0 * (1.0 + std::cos(kPi * pct)); }
}  // namespace

LrSchedule::LrSchedule(const ScheduleOptions& options, double base_lr, int64_t total_steps,
                       int64_t steps_per_epoch)
    : options_(options),
      base_lr_(base_lr),
      total_steps_(std::max<int64_t>(total_steps, 1)),
      steps_per_epoch_(std::max<int64_t>(steps_per_epoch, 1)),
      warmup_steps_(std::min<int64_t>(std::llround(options.warmup_epochs * static_cast<double>(steps_per_epoch)),
                                      total_steps_)) {}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps_) {
    // Linear from base * start_factor at step 0 towards base at the end of the warm-up (torch LinearLR).
    const double progress = static_cast<double>(step) / static_cast<double>(warmup_steps_);
    return base_lr_ * (options_.warmup_start_factor + (1.0 - options_.warmup_start_factor) * progress);
  }
  return after_warmup(step);
}

double LrSchedule::after_warmup(int64_t step) const {
  switch (options_.name) {
    case config::ScheduleKind::constant:
      return base_lr_;
    case config::ScheduleKind::multistep: {
      // Milestones are absolute epochs, as torch MultiStepLR stepped once per epoch.
      double lr = base_lr_;
      for (double milestone : options_.milestones)
        if (static_cast<double>(step) >= milestone * static_cast<double>(steps_per_epoch_)) lr *= options_.gamma;
      return lr;
    }
    case config::ScheduleKind::cosine: {
      const double span = static_cast<double>(std::max<int64_t>(total_steps_ - warmup_steps_, 1));
      const double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) / span);
      return options_.min_lr + (base_lr_ - options_.min_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
    }
    case config::ScheduleKind::onecycle: {
      // torch OneCycleLR (anneal_strategy="cos", two phases): rise over pct_start of the run from
      // base/div_factor to base, then fall to base/div_factor/final_div_factor at the last step.
      const double initial = base_lr_ / options_.div_factor;
      const double final_lr = initial / options_.final_div_factor;
      const double rise_end = options_.pct_start * static_cast<double>(total_steps_) - 1.0;
      const double fall_end = static_cast<double>(total_steps_) - 1.0;
      const double s = static_cast<double>(std::min(step, total_steps_ - 1));
      if (s <= rise_end) return cosine_between(initial, base_lr_, rise_end > 0 ? s / rise_end : 1.0);
      return cosine_between(base_lr_, final_lr, (s - rise_end) / std::max(fall_end - rise_end, 1e-12));
    }
  }
  return base_lr_;
}

}  // namespace ltrain::optim
