#pragma once
// Learning-rate schedules as pure functions of the optimizer step, with an optional linear warm-up.
// The host computes the value (a few flops) and writes it into the optimizer's device LR.
#include <cstdint>
#include <vector>

#include "ltrain/config/enums.h"

namespace ltrain::optim {

/// The schedule section's keys, all of which the schedule reads. No defaults of its own:
/// engine::schedule_options fills every field from config::ScheduleSection, the one place of the
/// defaults.
struct ScheduleOptions {
  config::ScheduleKind name;       ///< constant, multistep, cosine or onecycle
  double warmup_epochs;            ///< linear warm-up before the schedule, in epochs (fractions allowed)
  double warmup_start_factor;      ///< the warm-up starts at the base LR times this
  std::vector<double> milestones;  ///< multistep: epochs at which the LR is multiplied by gamma
  double gamma;                    ///< multistep: the factor at each milestone
  double min_lr;                   ///< cosine: the LR at the end
  double pct_start;                ///< onecycle: fraction of the steps spent rising to the peak
  double div_factor;               ///< onecycle: the start LR is the base LR / div_factor
  double final_div_factor;         ///< onecycle: the final LR is the start LR / final_div_factor
};

class LrSchedule {
 public:
  /// `base_lr` is the peak (optim.lr); `total_steps` the optimizer steps of the whole run.
  LrSchedule(const ScheduleOptions& options, double base_lr, int64_t total_steps, int64_t steps_per_epoch);

  /// The LR of optimizer step `step` (0-based).
  double at(int64_t step) const;

  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  double after_warmup(int64_t step) const;

  ScheduleOptions options_;
  double base_lr_;
  int64_t total_steps_;
  int64_t steps_per_epoch_;
  int64_t warmup_steps_;
};

}  // namespace ltrain::optim
