#pragma once
// Learning-rate schedules as pure functions of the optimizer step, with an optional linear warm-up.
// The host computes the value (a few flops) and writes it into the optimizer's device LR.
#include <cstdint>

#include "ltrain/config/config.h"

namespace ltrain::optim {

class LrSchedule {
 public:
  /// `base_lr` is the peak (optim.lr); `total_steps` the optimizer steps of the whole run.
  LrSchedule(const config::ScheduleSection& options, double base_lr, int64_t total_steps, int64_t steps_per_epoch);

  /// The LR of optimizer step `step` (0-based).
  double at(int64_t step) const;

  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  double after_warmup(int64_t step) const;

  config::ScheduleSection options_;
  double base_lr_;
  int64_t total_steps_;
  int64_t steps_per_epoch_;
  int64_t warmup_steps_;
};

}  // namespace ltrain::optim
