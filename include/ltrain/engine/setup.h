#pragma once
// Turning a config into the objects of a run: device, model, data. Shared by train, eval and bench.
#include <torch/torch.h>

#include "ltrain/amp/precision.h"
#include "ltrain/config/load.h"
#include "ltrain/data/loader.h"
#include "ltrain/engine/batch_graph.h"
#include "ltrain/models/resnet.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

/// run.device as a torch::Device. ConfigError (naming the key and its file) when this build or
/// this machine cannot provide it, or as check_device_fit.
torch::Device resolve_device(const config::LoadedConfig& loaded);

/// The settings run.device cannot run here: fp16 or TF32 on the CPU, bf16 or TF32 on a GPU older
/// than Ampere, CUDA graphs (cuda_graph.train, cuda_graph.eval) without a CUDA device. One
/// ConfigError with a line for each (the key, its file, what to set), or for run.device itself
/// when this build or machine has no such device. What `ltrain train --dry-run` and a run check
/// before anything else; a sweep calls it per point.
void check_device_fit(const config::LoadedConfig& loaded);
void check_device_fit(const config::LoadedConfig& loaded, const torch::Device& device);

/// Seeds LibTorch's generators with run.seed; sets the CPU thread count, TF32, cuDNN and
/// deterministic-algorithm switches.
void apply_runtime_settings(const config::RunConfig& config);

/// The most threads per CPU core run.threads may ask for.
constexpr int64_t kThreadsPerCore = 4;

/// ConfigError naming the key and its file when run.threads asks for more than kThreadsPerCore
/// threads per CPU core of this machine (where a run starts; a saved config evaluated elsewhere
/// keeps its value, which LibTorch caps).
void check_threads(const config::LoadedConfig& loaded);

/// Lets this process hold at most run.gpu_memory_fraction of CUDA `device`'s memory, and no more
/// than the memory of LTRAIN_GPU_PROFILE's card: past it, allocations fail as out of memory, as on
/// a smaller GPU. Returns the limit in bytes (-1 on the CPU, where it does nothing).
int64_t limit_gpu_memory(const config::RunConfig& config, const torch::Device& device);

/// What limit_gpu_memory and LTRAIN_GPU_PROFILE impose on `device`, as one log line; "" where
/// nothing does (the CPU, no profile, the whole memory).
std::string describe_gpu_limits(const torch::Device& device, int64_t memory_limit);

/// A freshly initialized model (seeded from run.seed) on `device`, NHWC with model.channels_last,
/// with the weights of model.init_from when set. ConfigError when model.checkpoint_segments exceeds
/// the model's residual blocks or model.init_from is no regular file; DataError naming the file and the
/// tensor when its weights do not fit the model.
models::ResNet build_model(const config::LoadedConfig& loaded, const torch::Device& device);

/// The memory format model.channels_last asks for.
torch::MemoryFormat memory_format(const config::RunConfig& config);

/// How a captured step or evaluation on `device` keeps its images (BatchGraph): in the model's
/// memory format; in autocast's fp16/bf16 (`plan`), which the stem's convolution casts them to
/// first, else in the batch's dtype; with cuda_graph.padded_images, with the channels cuDNN's stem
/// convolution runs fastest on (ops::padded_image_channels).
BatchGraph::StaticImages static_images(const config::RunConfig& config, const amp::PrecisionPlan& plan,
                                       const torch::Device& device);

/// The dataset `data` names, loaded and moved to `device`.
data::TrainTestSets load_data(const config::RunConfig& config, const torch::Device& device);

/// ConfigError naming model.num_classes and its file when the model has fewer outputs than the
/// data data.source names has classes (config::DataSection::classes; known before it is read).
void check_num_classes(const config::LoadedConfig& loaded);

/// ConfigError naming data.batch_size and its file when a training set of `train_images` holds
/// fewer images than a global batch (data.batch_size x optim.accumulation_steps x `processes`).
void check_batch_fits(const config::LoadedConfig& loaded, int64_t train_images, int64_t processes = 1);

/// The training loader over `train`, one batch per optimizer step (`shard`'s part of the global
/// step in a data-parallel run). ConfigError naming data.batch_size and its file when the set
/// holds fewer images than a global step.
data::TrainLoader make_train_loader(const config::LoadedConfig& loaded, const data::ImageSet& train,
                                    data::Shard shard = {});

}  // namespace ltrain::engine
