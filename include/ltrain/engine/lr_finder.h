#pragma once
// The learning-rate range test (Leslie Smith, "Cyclical Learning Rates for Training Neural
// Networks", 2017; fastai's lr_find): training steps from the config's start, the learning rate
// raised exponentially from one step to the next, the loss read after each; the suggested rate is
// where the smoothed loss falls fastest. The weights it trains are thrown away.
#include <cstdint>
#include <vector>

#include "ltrain/config/load.h"

namespace ltrain::engine {

struct LrFindOptions {
  int64_t steps = 100;      ///< steps of the ramp, at least 3
  double start_lr = 1e-7;   ///< the first step's learning rate, > 0
  double end_lr = 10.0;     ///< the last step's, > start_lr
  /// The test ends early once the smoothed loss is this many times its lowest (or not finite).
  double divergence = 4.0;
};

struct LrFindPoint {
  int64_t step = 0;  ///< 1-based
  double lr = 0.0;
  double loss = 0.0;           ///< the step's mean training loss
  double smoothed_loss = 0.0;  ///< its exponential average (0.98, bias-corrected, as fastai's)
};

struct LrFindResult {
  std::vector<LrFindPoint> points;
  double suggested_lr = 0.0;
  double lowest_loss_lr = 0.0;  ///< where the smoothed loss was lowest
  bool diverged = false;        ///< the test ended before its last step
};

/// Runs the test on `loaded`'s model, data and optimizer (its schedule is not used), in one
/// process. ConfigError for options out of range, and what a run's start throws.
LrFindResult find_lr(const config::LoadedConfig& loaded, const LrFindOptions& options);

/// The lr where the smoothed loss falls fastest against log(lr), before its lowest point, leaving
/// out the first points (10, at most a tenth of them), whose few averaged steps are noise; a tenth
/// of the lowest point's lr when it comes too early to tell.
double suggest_lr(const std::vector<LrFindPoint>& points);

}  // namespace ltrain::engine
