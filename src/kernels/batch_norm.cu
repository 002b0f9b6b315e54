// The host side of ltrain's BatchNorm over NHWC tensors: which reduction and grid a shape gets on the
// current device (cached per shape and device), the per-device accumulators, and the launches. The
// kernels themselves are in batch_norm_kernels.cu.
#include "ltrain/kernels/batch_norm.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "batch_norm_kernels.cuh"
#include "ltrain/kernels/device_limits.h"

namespace ltrain::kernels {
namespace {

using batch_norm_detail::Accumulators;
using batch_norm_detail::given_statistics_forward_of;
using batch_norm_detail::group_channels_of;
using batch_norm_detail::kernels_of;
using batch_norm_detail::KernelSet;
using batch_norm_detail::kMaxChannels;
using batch_norm_detail::kRowsPerThread;
using batch_norm_detail::kThreads;
using batch_norm_detail::kVector;
using batch_norm_detail::Reduction;

constexpr int kMaxBlocksPerSm = 4;
// Clusters of at most 4 blocks, aiming at 4 rows a thread: on Hopper (fp16 add+ReLU, forward +
// backward) these beat the grid reduction at 256-1024 rows, while clusters of 8 were slower than
// it at 2048 rows and clusters of 16 at 4096 (measured: docs/BENCHMARKS.md).
constexpr int kMaxClusterBlocks = 4;
constexpr int kClusterRowsPerThread = 4;

/// What `query(device)` says of the current device for `key`, asked once per key and device. A
/// query that fails returns Value{} (the callers then fall back) and clears the CUDA error it
/// caused, so that none is left for LibTorch's next check.
template <typename Value, typename Key, typename Query>
Value cached_per_device(const Key& key, Query query) {
  static std::mutex mutex;
  static std::map<std::pair<Key, int>, Value> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return Value{};
  }
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = cache.find({key, device});
    if (found != cache.end()) return found->second;
  }
  // Unlocked: a query may itself ask cached figures (of another Value type, another cache).
  const Value value = query(device);
  const std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(std::make_pair(key, device), value).first->second;
}

/// How many blocks of `kernel` fit on the current device at once, for a cooperative launch (which
/// may not ask for more), within the active GPU profile's limits; 0 without cooperative launch.
int resident_blocks(const void* kernel) {
  return cached_per_device<int>(kernel, [kernel](int) {
    const device::DeviceLimits limits = current_device_limits();
    if (!limits.cooperative_launch) return 0;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    // The driver's figure is for the GPU at hand; a profile's smaller card may hold fewer.
    per_sm = std::min({per_sm, resident_blocks_per_multiprocessor(facts_of(kernel), kThreads, limits), kMaxBlocksPerSm});
    return per_sm * limits.multiprocessors;
  });
}

/// How many clusters of `cluster_blocks` blocks of `kernel` the current device runs at once; 0
/// where it has no clusters (before sm_90, or a profile's card without them), where the kernel's
/// code was compiled without cluster instructions, or where it cannot form one that size.
int clusters_at_once(const void* kernel, int cluster_blocks) {
  return cached_per_device<int>(std::make_pair(kernel, cluster_blocks), [kernel, cluster_blocks](int device) {
    const device::DeviceLimits limits = current_device_limits();
    const KernelFacts facts = facts_of(kernel);
    if (!takes_clusters(facts, limits)) return 0;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(cluster_blocks);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster_blocks));
    config.blockDim = dim3(kThreads);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0, multiprocessors = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess ||
        cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        multiprocessors == 0) {
      cudaGetLastError();
      return 0;
    }
    // Within a profile's smaller card: its share of the multiprocessors, and no more blocks than
    // its limits hold.
    const int64_t scaled = int64_t{clusters} * limits.multiprocessors / multiprocessors;
    const int64_t by_limits =
        int64_t{resident_blocks_per_multiprocessor(facts, kThreads, limits)} * limits.multiprocessors / cluster_blocks;
    return static_cast<int>(std::min(scaled, by_limits));
  });
}

/// How both kernels of a (type, activation) run a shape: the reduction, and the grid's row groups
/// (gridDim.x; with Reduction::cluster also the cluster's size).
struct LaunchPlan {
  Reduction reduction = Reduction::none;
  KernelSet kernels;
  int64_t row_groups = 0;
  int64_t group_channels = 0;  // channels a block covers (gridDim.y = channels / group_channels)
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The rows a block covers at once with `group_channels` channels: one a thread, 8 channels each.
int64_t lanes_of(int64_t group_channels) { return kThreads / (group_channels / kVector); }

/// The fewest row groups that hold `rows` in the register kernels, kRowsPerThread rows a thread.
int64_t fewest_row_groups(int64_t rows, int64_t group_channels) {
  return ceil_div(rows, lanes_of(group_channels) * kRowsPerThread);
}

/// The smallest of `measure(kernel)` over every kernel of the set: what all of them can do.
template <typename Measure>
int fewest_over(const KernelSet& kernels, Measure measure) {
  int fewest = std::min(measure(kernels.forward), measure(kernels.backward));
  if (kernels.backward_second != nullptr) fewest = std::min(fewest, measure(kernels.backward_second));
  return fewest;
}

/// Clusters where each channel group's rows fit in one (no device-wide barrier, no atomics) and
/// every cluster fits on the device at once, with about kClusterRowsPerThread rows a thread.
/// Otherwise one cooperative grid, all of it resident, holding the rows in registers if it can,
/// streaming them if not.
LaunchPlan plan_for(ElementType type, BatchNormActivation activation, const BatchNormShape& shape) {
  const int64_t group_channels = group_channels_of(shape.channels);
  const int64_t channel_groups = shape.channels / group_channels;
  const int64_t lanes = lanes_of(group_channels);
  const int64_t fewest = fewest_row_groups(shape.rows, group_channels);
  const KernelSet cluster = kernels_of(type, activation, Reduction::cluster);
  if (cluster.forward != nullptr && fewest <= kMaxClusterBlocks) {
    auto clusters = [&](int64_t blocks) {
      const int size = static_cast<int>(blocks);
      return fewest_over(cluster, [size](const void* kernel) { return clusters_at_once(kernel, size); });
    };
    const int64_t aim = std::clamp<int64_t>(ceil_div(shape.rows, lanes * kClusterRowsPerThread), fewest,
                                            kMaxClusterBlocks);
    for (int64_t blocks = aim; blocks >= fewest; --blocks)
      if (clusters(blocks) >= channel_groups) return {Reduction::cluster, cluster, blocks, group_channels};
  }
  const KernelSet grid = kernels_of(type, activation, Reduction::grid);
  if (grid.forward == nullptr) return {};
  if (fewest * channel_groups <= fewest_over(grid, resident_blocks))
    return {Reduction::grid, grid, fewest, group_channels};
  // Streaming: as many row groups as fit on the device at once, none idle.
  const KernelSet streaming = kernels_of(type, activation, Reduction::streaming);
  const int64_t row_groups =
      std::min<int64_t>(fewest_over(streaming, resident_blocks) / channel_groups, ceil_div(shape.rows, lanes));
  if (row_groups >= 1) return {Reduction::streaming, streaming, row_groups, group_channels};
  return {};
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

/// What every kernel here takes: fp16 or bf16, channels a power of two from 8 to 2048, 2 rows or more.
bool takes_type_and_shape(ElementType type, const BatchNormShape& shape) {
  if (type != ElementType::float16 && type != ElementType::bfloat16) return false;
  if (!is_power_of_two(shape.channels) || shape.channels < kVector || shape.channels > kMaxChannels) return false;
  return shape.rows >= 2;
}

/// plan_for, for what the kernels take at all, once per shape and device.
LaunchPlan checked_plan_for(ElementType type, BatchNormActivation activation, const BatchNormShape& shape) {
  if (!takes_type_and_shape(type, shape)) return {};
  const auto key = std::make_tuple(static_cast<int>(type), static_cast<int>(activation), shape.rows, shape.channels);
  return cached_per_device<LaunchPlan>(key, [&](int) { return plan_for(type, activation, shape); });
}

/// The current device's accumulators, zeroed when first made; null when they do not exist yet
/// and cannot be made now (`stream` is capturing a graph, where allocation is not allowed).
Accumulators* accumulators_for(cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<int, Accumulators*> made;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = made.find(device);
  if (found != made.end()) return found->second;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return nullptr;
  Accumulators* accumulators = nullptr;
  // Kept for the life of the process: one per device that ran these kernels.
  if (cudaMalloc(&accumulators, sizeof(Accumulators)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaMemset(accumulators, 0, sizeof(Accumulators)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    cudaGetLastError();
    cudaFree(accumulators);
    return nullptr;
  }
  made.emplace(device, accumulators);
  return accumulators;
}

std::atomic<BatchNormDependentLaunch> dependent_launch{BatchNormDependentLaunch::none};

/// Whether `kernel`, launched with `reduction`, goes as a programmatic dependent of the kernel before
/// it: asked for launches like it, on a GPU of sm_90 or later (within the active GPU profile), and
/// from code compiled for sm_90 or later, which holds the kernel's wait for that kernel (without
/// it, the early start would race).
bool launches_dependent(const void* kernel, Reduction reduction) {
  switch (dependent_launch.load(std::memory_order_relaxed)) {
    case BatchNormDependentLaunch::none: return false;
    case BatchNormDependentLaunch::clusters:
      if (reduction != Reduction::cluster) return false;
      break;
    case BatchNormDependentLaunch::all: break;
  }
  return cached_per_device<bool>(kernel, [kernel](int) {
    return current_device_limits().capability.major >= 9 && facts_of(kernel).ptx_version >= 90;
  });
}

/// Launches `kernel` on a grid of `grid` blocks of kThreads threads with `parameters`: with
/// `reduction` grid or streaming cooperatively (all of it resident), with cluster in clusters of a
/// channel group's row groups, with none plainly; and as a programmatic dependent where
/// launches_dependent says so.
cudaError_t launch_kernel(const void* kernel, Reduction reduction, dim3 grid, void** parameters, cudaStream_t stream) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (reduction == Reduction::cluster) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = grid.x;  // a channel group's row groups are one cluster
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  } else if (reduction != Reduction::none) {
    attributes[count].id = cudaLaunchAttributeCooperative;
    attributes[count].val.cooperative = 1;
    ++count;
  }
  if (launches_dependent(kernel, reduction)) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelExC(&config, kernel, parameters);
}

/// Launches one of a plan's kernels on a grid of `row_groups` row groups by the channel groups of
/// `group_channels` channels.
template <typename Arguments>
cudaError_t launch(const void* kernel, Reduction reduction, const BatchNormShape& shape, int64_t row_groups,
                   int64_t group_channels, const Arguments& arguments, cudaStream_t stream) {
  if (kernel == nullptr || row_groups == 0 || group_channels == 0) return cudaErrorNotSupported;
  const bool cooperative = reduction != Reduction::cluster;
  Accumulators* accumulators = cooperative ? accumulators_for(stream) : nullptr;
  if (cooperative && accumulators == nullptr) return cudaErrorNotSupported;
  BatchNormShape shape_argument = shape;
  Arguments kernel_arguments = arguments;
  void* parameters[] = {&shape_argument, &kernel_arguments, &accumulators};
  const dim3 grid(static_cast<unsigned>(row_groups), static_cast<unsigned>(shape.channels / group_channels));
  return launch_kernel(kernel, reduction, grid, parameters, stream);
}

}  // namespace

KernelFit batch_norm_fit() {
  std::vector<const void*> kernels;
  for (const Reduction reduction : {Reduction::cluster, Reduction::grid, Reduction::streaming}) {
    const KernelSet set = kernels_of(ElementType::float16, BatchNormActivation::add_relu, reduction);
    kernels.insert(kernels.end(), {set.forward, set.backward, set.backward_second});
  }
  kernels.push_back(given_statistics_forward_of(ElementType::float16, BatchNormActivation::add_relu));
  return fit_on_current_device(kernels, kThreads, Cooperation::grid_or_cluster);
}

KernelFit batch_norm_cluster_fit() {
  const KernelSet cluster = kernels_of(ElementType::float16, BatchNormActivation::add_relu, Reduction::cluster);
  return cluster_fit(facts_of(cluster.forward), current_device_limits());
}

BatchNormReduction batch_norm_reduction(ElementType type, BatchNormActivation activation,
                                             const BatchNormShape& shape) {
  return checked_plan_for(type, activation, shape).reduction;
}

bool batch_norm_supported(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                               cudaStream_t stream) {
  const Reduction reduction = batch_norm_reduction(type, activation, shape);
  return reduction == Reduction::cluster || (reduction != Reduction::none && accumulators_for(stream) != nullptr);
}

namespace {

/// batch_norm_relu_mask_bytes for the plan the shape got.
int64_t relu_mask_bytes(const LaunchPlan& plan, BatchNormActivation activation, const BatchNormShape& shape) {
  const bool masked = activation == BatchNormActivation::add_relu && plan.reduction == Reduction::streaming;
  return masked ? shape.rows * shape.channels / kVector : 0;
}

}  // namespace

int64_t batch_norm_relu_mask_bytes(ElementType type, BatchNormActivation activation, const BatchNormShape& shape) {
  return relu_mask_bytes(checked_plan_for(type, activation, shape), activation, shape);
}

cudaError_t batch_norm_forward(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                                    const BatchNormForward& arguments, cudaStream_t stream) {
  const LaunchPlan plan = checked_plan_for(type, activation, shape);
  if (arguments.relu_mask == nullptr && relu_mask_bytes(plan, activation, shape) > 0) return cudaErrorInvalidValue;
  return launch(plan.kernels.forward, plan.reduction, shape, plan.row_groups, plan.group_channels, arguments, stream);
}

cudaError_t batch_norm_backward(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                                     const BatchNormBackward& arguments, cudaStream_t stream) {
  const LaunchPlan plan = checked_plan_for(type, activation, shape);
  if (arguments.relu_mask == nullptr && relu_mask_bytes(plan, activation, shape) > 0) return cudaErrorInvalidValue;
  const void* kernel = arguments.grad_y_second != nullptr ? plan.kernels.backward_second : plan.kernels.backward;
  return launch(kernel, plan.reduction, shape, plan.row_groups, plan.group_channels, arguments, stream);
}

bool batch_norm_given_statistics_supported(ElementType type, const BatchNormShape& shape) {
  return takes_type_and_shape(type, shape);
}

cudaError_t batch_norm_forward_given_statistics(ElementType type, BatchNormActivation activation,
                                                const BatchNormShape& shape, const BatchNormForward& arguments,
                                                cudaStream_t stream) {
  const void* kernel = given_statistics_forward_of(type, activation);
  if (kernel == nullptr || !takes_type_and_shape(type, shape)) return cudaErrorNotSupported;
  if (arguments.sum == nullptr || arguments.square_sum == nullptr) return cudaErrorInvalidValue;
  // The backward of this shape reads the mask where it streams, whichever forward ran.
  if (arguments.relu_mask == nullptr && batch_norm_relu_mask_bytes(type, activation, shape) > 0)
    return cudaErrorInvalidValue;
  // The channels a block covers as the shape's plan has them: the ReLU's mask is laid out by them,
  // and the plan's backward reads it.
  const int64_t planned_channels = checked_plan_for(type, activation, shape).group_channels;
  const int64_t group_channels = planned_channels > 0 ? planned_channels : group_channels_of(shape.channels);
  const int64_t channel_groups = shape.channels / group_channels;
  const int64_t lanes = lanes_of(group_channels);
  // The device filled with blocks, 2048 threads an SM, but no block without rows.
  const int64_t filling = std::max<int64_t>(1, int64_t{current_device_limits().multiprocessors} * 8 / channel_groups);
  const dim3 grid(static_cast<unsigned>(std::min(filling, ceil_div(shape.rows, lanes))),
                  static_cast<unsigned>(channel_groups));
  BatchNormShape shape_argument = shape;
  BatchNormForward kernel_arguments = arguments;
  void* parameters[] = {&shape_argument, &kernel_arguments};
  return launch_kernel(kernel, Reduction::none, grid, parameters, stream);
}

void set_batch_norm_dependent_launch(BatchNormDependentLaunch which) {
  dependent_launch.store(which, std::memory_order_relaxed);
}

}  // namespace ltrain::kernels
