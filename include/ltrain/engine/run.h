#pragma once
// What a config makes of a process, built in one order by every command that trains, times or
// evaluates a model (ltrain train, bench step, eval, the parity tool): the device (and, for a
// data-parallel run, the process group), the runtime switches, the GPU memory limit, the data on
// the device, its loaders, the model, and for training the optimizer and GradScaler. Everything
// that can fail on bad input fails here, before a command writes anything.
#include <cstdint>
#include <memory>
#include <optional>

#include <torch/torch.h>

#include "ltrain/amp/grad_scaler.h"
#include "ltrain/config/load.h"
#include "ltrain/data/loader.h"
#include "ltrain/dist/group.h"
#include "ltrain/models/resnet.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

/// What to build beyond the device and the model.
struct RunParts {
  bool data = true;      ///< the data set on the device and its test loader
  bool training = true;  ///< the training loader, the optimizer and the GradScaler (needs data)
  /// torchrun's variables naming several processes: join their group, take LOCAL_RANK's GPU,
  /// check that every process runs the same config, and load this rank's shards.
  bool data_parallel = false;
  /// The caller loads the model's weights itself (a resumed run, an evaluated checkpoint), so
  /// model.init_from is not read.
  bool weights_from_caller = false;
};

class Run {
 public:
  /// Builds what `parts` asks for (training needs data). ConfigError, DataError or PeerError for
  /// the user to act on.
  Run(const config::LoadedConfig& loaded, const RunParts& parts);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const config::LoadedConfig& loaded() const { return loaded_; }
  const config::RunConfig& config() const { return loaded_.config; }
  const torch::Device& device() const { return device_; }

  /// The data-parallel group; null in a one-process run.
  dist::Group* group() const { return group_.get(); }
  int64_t rank() const { return group_ ? group_->rank() : 0; }
  int64_t ranks() const { return group_ ? group_->size() : 1; }
  /// Rank 0, the process that writes files.
  bool main_process() const { return rank() == 0; }
  /// The process that logs the run's progress to its console: rank 0 of its node (LOCAL_RANK 0),
  /// so that each machine of a run over several shows it; the others log warnings and errors.
  bool console_process() const { return !group_ || group_->environment().local_rank == 0; }

  /// The bytes of the GPU this process may hold (run.gpu_memory_fraction, LTRAIN_GPU_PROFILE);
  /// -1 on the CPU.
  int64_t gpu_memory_limit() const { return gpu_memory_limit_; }

  /// With parts.data: the whole data set, on the device.
  const data::TrainTestSets& sets() const { return sets_.value(); }
  /// With parts.data: this rank's part of the test set.
  const data::EvalLoader& eval_loader() const { return eval_loader_.value(); }
  /// With parts.training: this rank's training batches.
  data::TrainLoader& train_loader() { return train_loader_.value(); }

  models::ResNet& model() { return model_; }
  /// With parts.training (std::bad_optional_access, like the other parts, where it was not built).
  optim::Optimizer& optimizer() { return *optimizer_.value(); }
  amp::GradScaler& scaler() { return scaler_.value(); }

  /// Leaves the process group, once nothing that holds its communicators (a captured step) is
  /// alive and no other rank may still need this one. Nothing in a one-process run.
  void close_group();

 private:
  config::LoadedConfig loaded_;
  torch::Device device_;
  std::unique_ptr<dist::Group> group_;
  int64_t gpu_memory_limit_ = -1;
  std::optional<data::TrainTestSets> sets_;
  std::optional<data::EvalLoader> eval_loader_;
  std::optional<data::TrainLoader> train_loader_;
  models::ResNet model_{nullptr};
  std::optional<std::unique_ptr<optim::Optimizer>> optimizer_;
  std::optional<amp::GradScaler> scaler_;
};

}  // namespace ltrain::engine
