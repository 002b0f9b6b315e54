#pragma once
// What a training checkpoint holds, on top of io's verified container: the model's state_dict
// under "model/", the optimizer's state under "optim/", the GradScaler's under "scaler/", the
// random generators' under "rng/", the averaged weights (optim.ema_decay) under "ema/", and JSON info: where the run stands (epoch, step, steps done
// in the current epoch), the trainer's running sums, the resolved config, the metrics at that
// point and versions. Weights can be read without the training state (`export`, `eval`).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ltrain/amp/grad_scaler.h"
#include "ltrain/config/config.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

/// 1: weights and optimizer state only (not resumable); 2: the full training state.
inline constexpr int64_t kCheckpointVersion = 2;

struct CheckpointMeta {
  int64_t version = kCheckpointVersion;
  int64_t epoch = 0;             ///< epochs completed
  int64_t step = 0;              ///< optimizer steps completed
  int64_t epoch_steps_done = 0;  ///< steps done in epoch `epoch + 1` (0 at an epoch boundary)
  nlohmann::json config = nlohmann::json::object();    ///< config::to_json of the run
  nlohmann::json metrics = nlohmann::json::object();   ///< e.g. {"test_acc": 0.91}
  nlohmann::json progress = nlohmann::json::object();  ///< the trainer's running sums, to continue exactly
};

struct Checkpoint {
  CheckpointMeta meta;
  NamedTensors model;      ///< state_dict names, CPU tensors
  NamedTensors optimizer;  ///< optimizer state names, CPU tensors
  NamedTensors scaler;     ///< GradScaler state (empty without one)
  NamedTensors rng;        ///< "cpu", "cuda:N": generator states
  /// With optim.ema_decay: the model's state_dict with the averaged values (else empty).
  NamedTensors ema_weights;
};

/// The weights the run evaluated: the averaged ones with optim.ema_decay, else the model's.
const NamedTensors& evaluation_weights(const Checkpoint& checkpoint);

/// Writes a checkpoint atomically, with the CPU generator's state and, for a model on a GPU, that
/// GPU's. `optimizer` and `scaler` may be null (weights only). RunError when the disk refuses; the
/// file it would replace, and every other, stays as it was.
void save_checkpoint(const std::filesystem::path& file, const torch::nn::Module& model,
                     const optim::Optimizer* optimizer, const amp::GradScaler* scaler, const CheckpointMeta& meta,
                     const NamedTensors& ema_weights = {});

/// Reads and verifies a checkpoint; DataError naming the file when it is not one. A directory, a
/// FIFO or a device is refused before it is opened.
Checkpoint read_checkpoint(const std::filesystem::path& file);

/// DataError naming `file` and the first setting that differs when the checkpoint's model is not
/// the one `config` builds (architecture, stem, width, classes), or when it cannot be resumed.
void check_resumable(const Checkpoint& checkpoint, const config::RunConfig& config, const std::filesystem::path& file);

/// Copies a checkpoint's weights, optimizer, scaler and generator states into the objects of a
/// run (their tensors keep their addresses). DataError naming `file` on a missing or misshapen entry.
void restore_training_state(const Checkpoint& checkpoint, const std::filesystem::path& file, torch::nn::Module& model,
                            optim::Optimizer& optimizer, amp::GradScaler& scaler);

struct FoundCheckpoint {
  std::filesystem::path file;
  Checkpoint checkpoint;
};

/// The newest resumable step-*.ltc in `folder` that reads and verifies; damaged or older-format
/// files are skipped, each with a warning naming it and why. nullopt when none is left.
std::optional<FoundCheckpoint> newest_valid_checkpoint(const std::filesystem::path& folder);

/// "step-00001950.ltc": names that sort in step order.
std::string checkpoint_file_name(int64_t step);

/// The best checkpoint's name (checkpoint.best_metric); pruning never touches it.
inline constexpr const char* kBestCheckpointName = "best.ltc";

/// Deletes all but the newest `keep_last` step-*.ltc files in `folder`.
void prune_checkpoints(const std::filesystem::path& folder, int64_t keep_last);

}  // namespace ltrain::engine
