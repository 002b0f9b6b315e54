#include "ltrain/engine/setup.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/amp/precision.h"
#include "ltrain/core/build_info.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/device/gpu_profile.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/io/tensor_file.h"
#include "ltrain/ops/batch_norm.h"
#include "ltrain/ops/convolution.h"

namespace ltrain::engine {

namespace {

/// The precision settings `device` cannot run, as config error lines.
void check_precision_support(const config::LoadedConfig& loaded, const torch::Device& device,
                             std::vector<std::string>& problems) {
  const config::PrecisionSection& precision = loaded.config.precision;
  const amp::PrecisionPlan plan = precision_plan(precision);
  const auto refuse = [&](const char* key, const std::string& message) {
    problems.push_back(config::config_error(loaded, key, message).what());
  };
  if (device.is_cpu()) {
    if (precision.mode == config::PrecisionMode::fp16)
      refuse("precision.mode", "fp16 autocast needs a CUDA device; on the CPU use \"bf16\" (CPU autocast) or \"fp32\"");
    else if (plan.tf32)
      refuse(precision.mode == config::PrecisionMode::tf32 ? "precision.mode" : "precision.tf32",
             "TF32 is a feature of NVIDIA GPUs (Ampere and newer); use \"fp32\" on the CPU");
    if (precision.mode == config::PrecisionMode::fp16 && precision.tf32)
      refuse("precision.tf32", "TF32 is a feature of NVIDIA GPUs (Ampere and newer); set it to false on the CPU");
    return;
  }
  const auto [major, minor] = compat::cuda_capability(device.index());
  if (major < 8 && (precision.mode == config::PrecisionMode::bf16 || plan.tf32))
    refuse(precision.mode == config::PrecisionMode::bf16 ? "precision.mode" : "precision.tf32",
           fmt::format("needs an Ampere or newer GPU (compute capability 8.0); {} has {}.{}: use \"fp16\" or \"fp32\"",
                       device.str(), major, minor));
}

/// A channels_last model the CPU convolutions cannot run, as a config error line. The narrowest
/// convolutions of every architecture have model.width channels (the stem's 3 input channels take
/// no input gradient). Grouped ones of 1, 2 or 4 channels a group (resnext50_32x4d at width 8, 32,
/// 64) ran clean under valgrind on Debian's LibTorch 1.13, so the groups' widths are not checked.
void check_layout_support(const config::LoadedConfig& loaded, const torch::Device& device,
                          std::vector<std::string>& problems) {
  const config::ModelSection& model = loaded.config.model;
  const int64_t least = compat::min_cpu_channels_last_channels();
  if (!device.is_cpu() || !model.channels_last || model.width >= least) return;
  problems.push_back(
      config::config_error(loaded, "model.channels_last",
                           fmt::format("channels_last on the CPU needs model.width {} or more (LibTorch's oneDNN "
                                       "overruns a buffer in the backward pass of narrower convolutions); "
                                       "model.width is {}: set model.channels_last to false or widen the model",
                                       least, model.width))
          .what());
}

/// CUDA graphs where they cannot run, as config error lines.
void check_cuda_graph_support(const config::LoadedConfig& loaded, const torch::Device& device,
                              std::vector<std::string>& problems) {
  if (device.is_cuda()) return;
  const config::CudaGraphSection& graph = loaded.config.cuda_graph;
  for (const auto& [key, on] : {std::pair{"cuda_graph.train", graph.train}, std::pair{"cuda_graph.eval", graph.eval}})
    if (on)
      problems.push_back(config::config_error(loaded, key,
                                              fmt::format("CUDA graphs need a CUDA device and run.device is {}; set "
                                                          "it to false, or run on a GPU with a CUDA build of ltrain",
                                                          device.str()))
                             .what());
}

/// run.device as a torch::Device, unchecked against the other settings.
torch::Device named_device(const config::LoadedConfig& loaded) {
  const std::string& name = loaded.config.run.device;
  const int gpus = compat::cuda_device_count();
  if (name == "auto") return gpus > 0 ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (!compat::built_with_cuda())
    throw config::config_error(loaded, "run.device",
                               "this ltrain was built against a CPU-only LibTorch; use \"cpu\", or build it with "
                               "a CUDA LibTorch on a GPU machine (bash scripts/setup.sh)");
  const int index = name == "cuda" ? 0 : std::stoi(name.substr(5));
  if (index >= gpus)
    throw config::config_error(loaded, "run.device",
                               fmt::format("this machine has {} usable CUDA device(s); use \"cuda:0\"..\"cuda:{}\" "
                                           "or \"cpu\"",
                                           gpus, gpus - 1));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

void check_device_fit(const config::LoadedConfig& loaded, const torch::Device& device) {
  std::vector<std::string> problems;
  check_precision_support(loaded, device, problems);
  check_layout_support(loaded, device, problems);
  check_cuda_graph_support(loaded, device, problems);
  if (!problems.empty()) throw ConfigError(fmt::format("{}", fmt::join(problems, "\n")));
}

torch::Device resolve_device(const config::LoadedConfig& loaded) {
  const torch::Device device = named_device(loaded);
  check_device_fit(loaded, device);
  return device;
}

void check_device_fit(const config::LoadedConfig& loaded) { check_device_fit(loaded, named_device(loaded)); }

namespace {
/// The CPU cores the OS reports (at least 1).
int64_t cpu_cores() { return static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())); }
/// The most threads run.threads may give on this machine.
int64_t most_threads() { return kThreadsPerCore * cpu_cores(); }

/// The BatchNorm launches cuda_graph.dependent_launch makes programmatic dependents.
ops::BatchNormDependentLaunch batch_norm_dependent_launch(config::DependentLaunch setting) {
  switch (setting) {
    case config::DependentLaunch::automatic: return ops::BatchNormDependentLaunch::clusters;
    case config::DependentLaunch::on: return ops::BatchNormDependentLaunch::all;
    case config::DependentLaunch::off: break;
  }
  return ops::BatchNormDependentLaunch::none;
}
}  // namespace

void check_threads(const config::LoadedConfig& loaded) {
  if (loaded.config.run.threads > most_threads())
    throw config::config_error(loaded, "run.threads",
                               fmt::format("this machine has {} CPU cores; use at most {} threads (0: one per core)",
                                           cpu_cores(), most_threads()));
}

void apply_runtime_settings(const config::RunConfig& config) {
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  // LibTorch's default counts physical cores only (1 on a 2-vCPU machine); use every core.
  const int64_t cores = cpu_cores();
  // Training refuses more (check_threads); evaluating a checkpoint from a larger machine, whose
  // saved run.threads this one cannot give, runs with the most it can.
  int64_t threads = config.run.threads > 0 ? config.run.threads : cores;
  if (threads > most_threads()) {
    spdlog::warn("run.threads = {}: this machine has {} CPU cores; using {} threads", threads, cores, most_threads());
    threads = most_threads();
  }
  torch::set_num_threads(static_cast<int>(threads));
  // LibTorch lets cuDNN use TF32 by default; only TF32 modes do here.
  const bool tf32 = precision_plan(config.precision).tf32;
  compat::set_tf32(/*matmul=*/tf32, /*convolutions=*/tf32);
  compat::set_cudnn(config.precision.cudnn_benchmark, config.precision.deterministic,
                    static_cast<int>(config.precision.cudnn_benchmark_limit));
  compat::set_deterministic(config.precision.deterministic);
  ops::set_batch_norm_dependent_launch(batch_norm_dependent_launch(config.cuda_graph.dependent_launch));
}

int64_t limit_gpu_memory(const config::RunConfig& config, const torch::Device& device) {
  if (!device.is_cuda()) return -1;
  const auto total = static_cast<double>(compat::device_total_memory_bytes(device));
  compat::limit_device_memory(
      device, device::memory_within_profile(static_cast<int64_t>(config.run.gpu_memory_fraction * total)));
  return compat::device_memory_bytes(device);
}

std::string describe_gpu_limits(const torch::Device& device, int64_t memory_limit) {
  if (!device.is_cuda()) return "";
  const device::GpuProfile* profile = device::active_gpu_profile();
  const int64_t total = compat::device_total_memory_bytes(device);
  if (profile == nullptr && memory_limit >= total) return "";
  constexpr double kGiB = 1 << 30;
  return (profile == nullptr ? "" : device::describe_gpu_profile(*profile) + "; ") +
         fmt::format("this process may hold {:.1f} GiB of {}'s {:.1f} GiB", memory_limit / kGiB, device.str(),
                     total / kGiB);
}

torch::MemoryFormat memory_format(const config::RunConfig& config) {
  return config.model.channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
}

BatchGraph::StaticImages static_images(const config::RunConfig& config, const amp::PrecisionPlan& plan,
                                       const torch::Device& device) {
  BatchGraph::StaticImages images;
  images.format = memory_format(config);
  if (plan.autocast) images.dtype = plan.dtype;
  if (config.cuda_graph.padded_images) {
    constexpr int64_t kImageChannels = 3;  // RGB, what every data source gives
    images.channels = ops::padded_image_channels(kImageChannels, images.dtype.value_or(torch::kFloat32),
                                                 images.format, device);
  }
  return images;
}

models::ResNet build_model(const config::LoadedConfig& loaded, const torch::Device& device) {
  const config::RunConfig& config = loaded.config;
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  models::ResNet model(resnet_options(config.model));
  const auto blocks = static_cast<int64_t>(model->blocks().size());
  if (config.model.checkpoint_segments > blocks)
    throw config::config_error(loaded, "model.checkpoint_segments",
                               fmt::format("{} has {} residual blocks; use at most {} segments",
                                           config::to_string(config.model.arch), blocks, blocks));
  if (!config.model.init_from.empty()) {
    const std::string& file = config.model.init_from;
    std::error_code no_absolute_path;  // then the path is shown as given
    if (const std::string problem = files::not_a_readable_file(file); !problem.empty())
      throw config::config_error(loaded, "model.init_from",
                                 fmt::format("{}{} (expected a .safetensors file of the model's weights)", problem,
                                             std::filesystem::path(file).is_relative()
                                                 ? ", looked for at " + std::filesystem::absolute(file, no_absolute_path).string()
                                                 : ""));
    load_state_dict(*model, io::read_safetensors(file), file);
  }
  model->to(device);
  if (config.model.channels_last) {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model->parameters())
      if (parameter.dim() == 4) parameter.set_data(parameter.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  return model;
}

namespace {
/// Where a relative data.root left at its default is looked for after the working directory:
/// the source folder ltrain was built from, then the folder above the running program's (the
/// checkout of build/ltrain, the prefix of an installed bin/ltrain).
std::vector<std::filesystem::path> other_data_bases(const config::DataSection& data) {
  if (data.root != config::default_data_root(data.source)) return {};
  std::vector<std::filesystem::path> bases{source_dir()};
  std::error_code no_link;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", no_link);
  if (!no_link && program.parent_path().parent_path() != bases.front())
    bases.push_back(program.parent_path().parent_path());
  return bases;
}

/// The memory this machine has for new allocations (MemAvailable of /proc/meminfo), -1 where it
/// does not say.
int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

/// ConfigError where the synthetic source's images would not fit in this machine's memory: made as
/// uint8 on the host, and on the CPU the training loader's copy for augmentation (zero-bordered for
/// random crops) beside them (both alive while the copy is made). A machine that runs out of memory
/// ends the process with no word, so this is asked before anything is made.
void check_synthetic_data_fits(const config::RunConfig& config, const torch::Device& device) {
  const config::DataSection& data = config.data;
  if (data.source != config::DataSource::synthetic) return;
  const auto image_bytes = static_cast<double>(3 * data.image_size * data.image_size);
  const double copy_side =
      static_cast<double>(data.image_size + 2 * data::augmentation_border(data.random_crop, data.crop_padding));
  // The augmentation copy's bytes per image byte: 0 without it, more than 1 with a border.
  const double copy_per_image = device.is_cpu() && data::keeps_augmentation_copy(data.random_crop, data.horizontal_flip)
                                    ? copy_side * copy_side / static_cast<double>(data.image_size * data.image_size)
                                    : 0.0;
  const double needed = image_bytes * (static_cast<double>(data.synthetic_train_size) * (1.0 + copy_per_image) +
                                       static_cast<double>(data.synthetic_test_size));
  const int64_t available = available_memory_bytes();
  if (available > 0 && needed > static_cast<double>(available))
    throw ConfigError(fmt::format(
        "data.synthetic_train_size = {}, data.synthetic_test_size = {}: the synthetic {}x{} images need {:.1f} GB "
        "of memory{}, more than the {:.1f} GB this machine has available; use fewer images",
        data.synthetic_train_size, data.synthetic_test_size, data.image_size, data.image_size, needed / 1e9,
        copy_per_image > 0 ? " (with the training loader's copy for augmentation)" : "",
        static_cast<double>(available) / 1e9));
}
}  // namespace

data::TrainTestSets load_data(const config::RunConfig& config, const torch::Device& device) {
  check_synthetic_data_fits(config, device);
  data::TrainTestSets sets = data::load_sets(source_options(config.data), static_cast<uint64_t>(config.run.seed),
                                             other_data_bases(config.data));
  return {sets.train.to(device), sets.test.to(device)};
}

void check_num_classes(const config::LoadedConfig& loaded) {
  // A label past the model's outputs would stop the first step (or evaluation) inside the loss.
  const int64_t classes = loaded.config.data.classes();
  if (loaded.config.model.num_classes < classes)
    throw config::config_error(loaded, "model.num_classes",
                               fmt::format("the data has {} classes (labels 0 to {}); use at least {}", classes,
                                           classes - 1, classes));
}

void check_batch_fits(const config::LoadedConfig& loaded, int64_t train_images, int64_t processes) {
  // An optimizer step takes K micro-batches: the loader serves K * batch_size images at a time.
  const int64_t accumulation = loaded.config.optim.accumulation_steps;
  if (train_images >= loaded.config.data.batch_size * accumulation * processes) return;
  std::string why = accumulation == 1
                        ? fmt::format("larger than the training set ({} images); use a smaller batch", train_images)
                        : fmt::format("times optim.accumulation_steps ({}) is larger than the training set ({} "
                                      "images); use a smaller batch or fewer accumulation steps",
                                      accumulation, train_images);
  if (processes > 1)
    why = fmt::format("times {} processes times optim.accumulation_steps ({}) is larger than the training set ({} "
                      "images); use a smaller batch",
                      processes, accumulation, train_images);
  throw config::config_error(loaded, "data.batch_size", why);
}

data::TrainLoader make_train_loader(const config::LoadedConfig& loaded, const data::ImageSet& train, data::Shard shard) {
  check_batch_fits(loaded, train.size(), shard.count);
  const auto seed = static_cast<uint64_t>(loaded.config.run.seed);
  return data::TrainLoader(train, train_loader_options(loaded.config), seed, shard);
}

}  // namespace ltrain::engine
