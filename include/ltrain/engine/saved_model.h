#pragma once
// What ltrain does with a checkpoint besides resuming it: evaluate its model on the test set, and
// export its weights for PyTorch (`ltrain eval`, `ltrain export`).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/evaluator.h"

namespace ltrain::engine {

struct CheckpointEvaluation {
  int64_t step = 0;  ///< the optimizer steps the checkpoint was written after
  config::DataSection data;  ///< the data it was evaluated on (the saved config's, with the overrides)
  EvalResult result;
};

/// The checkpoint's model (its averaged weights with optim.ema_decay) on the test set, under the
/// checkpoint's saved config with `overrides` ("key=value") applied. ConfigError, DataError as
/// for training.
CheckpointEvaluation evaluate_checkpoint(const std::filesystem::path& file, const std::vector<std::string>& overrides);

/// The safetensors metadata an export carries: its producer and source, the step, every model.*
/// setting, the data set (data.source, and data.cifar100_labels for CIFAR-100) and how the inputs
/// were scaled (data.normalize, mean, std), so that a reader can rebuild the model and feed it
/// what it was trained on. Strings as they are, other values as JSON.
std::map<std::string, std::string> export_metadata(const Checkpoint& checkpoint, const std::filesystem::path& file);

/// Writes the checkpoint's evaluation weights (torchvision's names) to `out` as safetensors with
/// export_metadata. Returns the number of tensors written.
size_t export_weights(const std::filesystem::path& file, const std::filesystem::path& out);

}  // namespace ltrain::engine
