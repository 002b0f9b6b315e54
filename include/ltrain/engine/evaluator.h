#pragma once
// Test-set evaluation: every image once, sums kept on the device, one host sync at the end.
#include <cstdint>

#include "ltrain/config/config.h"
#include "ltrain/data/loader.h"
#include "ltrain/models/resnet.h"

namespace ltrain::engine {

struct EvalResult {
  double loss = 0.0;      ///< mean cross-entropy (no label smoothing)
  double accuracy = 0.0;  ///< top-1, fraction in [0, 1]
  int64_t correct = 0;
  int64_t images = 0;
};

/// Runs `model` in eval mode (BatchNorm running statistics) over every test batch, with the
/// config's autocast and memory format; restores the model's previous train/eval mode.
EvalResult evaluate(models::ResNet& model, const data::EvalLoader& loader, const config::RunConfig& config);

}  // namespace ltrain::engine
