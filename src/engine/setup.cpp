#include "ltrain/engine/setup.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/core/torch_compat.h"

namespace ltrain::engine {

torch::Device resolve_device(const config::LoadedConfig& loaded) {
  const std::string& name = loaded.config.run.device;
  const int gpus = compat::cuda_device_count();
  if (name == "auto") return gpus > 0 ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (!compat::built_with_cuda())
    throw config::config_error(loaded, "run.device",
                               "this ltrain was built against a CPU-only LibTorch; use \"cpu\", or build it on a GPU "
                               "host with scripts/gpu-host-build.sh");
  const int index = name == "cuda" ? 0 : std::stoi(name.substr(5));
  if (index >= gpus)
    throw config::config_error(loaded, "run.device",
                               fmt::format("this machine has {} usable CUDA device(s); use \"cuda:0\"..\"cuda:{}\" or "
                                           "\"cpu\"",
                                           gpus, gpus - 1));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void apply_runtime_settings(const config::RunConfig& config) {
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  // LibTorch's default counts physical cores only (1 on a 2-vCPU machine); use every core.
  const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(static_cast<int>(config.run.threads > 0 ? config.run.threads : cores));
  // LibTorch lets cuDNN use TF32 by default; fp32 means IEEE float32.
  compat::set_tf32(/*matmul=*/false, /*convolutions=*/false);
  compat::set_cudnn(config.precision.cudnn_benchmark, /*deterministic=*/false);
}

models::ResNet build_model(const config::RunConfig& config, const torch::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  models::ResNet model(config.model);
  model->to(device);
  return model;
}

optim::NamedTensors named_parameters(const torch::nn::Module& module) {
  optim::NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

namespace {
void collect_state(const torch::nn::Module& module, const std::string& prefix, optim::NamedTensors& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.emplace_back(prefix + item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) out.emplace_back(prefix + item.key(), item.value());
  for (const auto& child : module.named_children()) collect_state(*child.value(), prefix + child.key() + ".", out);
}
}  // namespace

optim::NamedTensors state_dict(const torch::nn::Module& module) {
  optim::NamedTensors out;
  collect_state(module, "", out);
  return out;
}

void load_state_dict(torch::nn::Module& module, const optim::NamedTensors& tensors, const std::string& source) {
  const optim::NamedTensors targets = state_dict(module);
  for (const auto& [name, value] : tensors) {
    if (std::none_of(targets.begin(), targets.end(), [&](const auto& t) { return t.first == name; }))
      throw DataError(fmt::format("{}: unexpected tensor \"{}\": the weights are for another model (check model.arch, "
                                  "model.stem, model.width)",
                                  source, name));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
    if (it == tensors.end())
      throw DataError(fmt::format("{}: missing tensor \"{}\": the weights are for another model (check model.arch, "
                                  "model.stem, model.width)",
                                  source, name));
    if (it->second.sizes() != target.sizes())
      throw DataError(fmt::format("{}: tensor \"{}\" has shape [{}], the model expects [{}] (check model.num_classes "
                                  "and model.width)",
                                  source, name, fmt::join(it->second.sizes(), ", "), fmt::join(target.sizes(), ", ")));
    target.copy_(it->second);
  }
}

data::TrainTestSets load_data(const config::RunConfig& config, const torch::Device& device) {
  data::TrainTestSets sets = data::load_sets(config.data, static_cast<uint64_t>(config.run.seed));
  return {sets.train.to(device), sets.test.to(device)};
}

}  // namespace ltrain::engine
