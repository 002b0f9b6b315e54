#pragma once
// What a training checkpoint holds, on top of io's verified container: the model's state_dict
// under "model/", the optimizer's state under "optim/", and JSON info (epoch, step, the resolved
// config, the metrics at that point, versions). Weights can be read without the training state.
#include <cstdint>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

struct CheckpointMeta {
  int64_t epoch = 0;  ///< epochs completed
  int64_t step = 0;   ///< optimizer steps completed
  nlohmann::json config = nlohmann::json::object();   ///< config::to_json of the run
  nlohmann::json metrics = nlohmann::json::object();  ///< e.g. {"test_acc": 0.91}
};

struct Checkpoint {
  CheckpointMeta meta;
  optim::NamedTensors model;      ///< state_dict names, CPU tensors
  optim::NamedTensors optimizer;  ///< optimizer state names, CPU tensors
};

/// Writes a checkpoint atomically. `optimizer` may be null (weights only).
void save_checkpoint(const std::filesystem::path& file, const torch::nn::Module& model,
                     const optim::Optimizer* optimizer, const CheckpointMeta& meta);

/// Reads and verifies a checkpoint; DataError naming the file when it is not one.
Checkpoint read_checkpoint(const std::filesystem::path& file);

/// "step-00001950.ltc": names that sort in step order.
std::string checkpoint_file_name(int64_t step);

/// Deletes all but the newest `keep_last` checkpoint files in `folder`.
void prune_checkpoints(const std::filesystem::path& folder, int64_t keep_last);

}  // namespace ltrain::engine
