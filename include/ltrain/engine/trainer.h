#pragma once
// The training loop: read it top to bottom in trainer.cpp.
#include <cstdint>
#include <filesystem>

#include "ltrain/config/load.h"

namespace ltrain::engine {

struct TrainResult {
  std::filesystem::path run_dir;
  int64_t epochs = 0;            ///< epochs completed
  int64_t steps = 0;             ///< optimizer steps completed
  double final_test_accuracy = 0.0;
  double final_test_loss = 0.0;
  double best_test_accuracy = 0.0;
  int64_t best_epoch = 0;
  double train_seconds = 0.0;    ///< time in training steps (no evaluation, no checkpoints)
  double wall_seconds = 0.0;     ///< the whole run after set-up
  double images_per_second = 0.0;  ///< training images / train_seconds
};

/// Trains as `loaded` says, writing logs, metrics, checkpoints and summary.json into a new run
/// directory. Throws ConfigError, DataError or RunError for the user to act on.
TrainResult train(const config::LoadedConfig& loaded);

}  // namespace ltrain::engine
