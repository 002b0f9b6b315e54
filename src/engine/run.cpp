#include "ltrain/engine/run.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/amp/precision.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"

namespace ltrain::engine {
namespace {

/// The data-parallel process group when torchrun's variables name more than one process; with
/// one GPU per process, "auto" and "cuda" in run.device become this process's LOCAL_RANK.
std::unique_ptr<dist::Group> join_group(const config::LoadedConfig& loaded, torch::Device& device) {
  const std::optional<dist::Environment> environment = dist::read_environment();
  if (!environment || environment->world_size == 1) return nullptr;
  const std::string& name = loaded.config.run.device;
  if (device.is_cuda() && (name == "auto" || name == "cuda")) {
    if (environment->local_rank >= compat::cuda_device_count())
      throw config::config_error(loaded, "run.device",
                                 fmt::format("LOCAL_RANK {} but this machine has {} CUDA device(s): start at most one "
                                             "process per GPU",
                                             environment->local_rank, compat::cuda_device_count()));
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(environment->local_rank));
  }
  auto group = std::make_unique<dist::Group>(*environment, group_options(loaded.config.distributed), device);
  // Every process must train the same thing: compare the resolved configs.
  const std::vector<std::string> configs = group->all_gather_text("config", config::to_json(loaded.config).dump());
  for (size_t rank = 1; rank < configs.size(); ++rank)
    if (configs[rank] != configs[0]) {
      const std::vector<std::string> changes =
          config::changed_settings(nlohmann::json::parse(configs[0]), nlohmann::json::parse(configs[rank]));
      throw ConfigError(fmt::format("rank {}'s config differs from rank 0's: {}; every process must run the same "
                                    "config and --set flags",
                                    rank, fmt::join(changes, ", ")));
    }
  return group;
}

/// Rank `rank`'s contiguous part of `set` when it is split into `count` parts (sizes differ by at most one).
data::ImageSet shard_of(const data::ImageSet& set, int64_t rank, int64_t count) {
  const int64_t begin = set.size() * rank / count;
  const int64_t end = set.size() * (rank + 1) / count;
  return {set.images.narrow(0, begin, end - begin), set.labels.narrow(0, begin, end - begin)};
}

}  // namespace

Run::Run(const config::LoadedConfig& loaded, const RunParts& parts)
    : loaded_(loaded), device_(resolve_device(loaded)) {
  const config::RunConfig& config = loaded_.config;
  if (parts.training && !parts.data) throw std::logic_error("Run: training needs the data");
  if (parts.data_parallel) group_ = join_group(loaded_, device_);
  if (parts.training) check_threads(loaded_);
  apply_runtime_settings(config);
  gpu_memory_limit_ = limit_gpu_memory(config, device_);
  if (parts.data) {
    check_num_classes(loaded_);
    sets_.emplace(load_data(config, device_));
    if (parts.training) train_loader_.emplace(make_train_loader(loaded_, sets_->train, {rank(), ranks()}));
    eval_loader_.emplace(shard_of(sets_->test, rank(), ranks()), eval_loader_options(config.data));
  }
  config::LoadedConfig model_source = loaded_;
  if (parts.weights_from_caller) model_source.config.model.init_from.clear();
  model_ = build_model(model_source, device_);
  if (parts.training) {
    optimizer_ = optim::make_optimizer(optimizer_options(config.optim), named_parameters(*model_));
    scaler_.emplace(grad_scaler_options(config.precision), device_);
  }
}

void Run::close_group() {
  if (group_) group_->close();
}

}  // namespace ltrain::engine
