#include "ltrain/kernels/batch_norm_nhwc.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "element_access.cuh"

namespace ltrain::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kVector = 8;          // fp16/bf16 elements per 16-byte load
constexpr int kGroupChannels = 64;  // channels per block: 8 threads across, 32 rows down
constexpr int64_t kMaxChannels = 2048;
// Rows a thread keeps in registers from the first pass to the second: a tensor is taken only if
// the grid, all of it resident at once, covers it with this many rows per thread.
constexpr int kRowsPerThread = 8;
constexpr int kMaxBlocksPerSm = 4;

int64_t group_channels_of(int64_t channels) { return std::min<int64_t>(channels, kGroupChannels); }

/// The per-device state the kernels share: two sets of per-channel sums and which one the next
/// launch adds into. A launch adds into sums[parity], zeroes the other set for the launch after
/// it, and flips the parity once every block has read it: no memset between launches. Launches on
/// one device must run one at a time (ltrain trains each device from one stream).
struct Accumulators {
  float sums[2][2 * kMaxChannels];
  unsigned int parity;
};

/// A thread's share of [rows, channels]. The grid is (row groups, channel groups): block (r, g)
/// covers channels [g * group_channels, (g + 1) * group_channels) of rows r * lanes + lane, then
/// every gridDim.x * lanes rows after it, at most kRowsPerThread of them; a thread covers 8
/// adjacent channels of those rows.
struct Place {
  int64_t first_channel;  // the thread's first channel in the tensor
  int channel_in_group;   // ... and in its block's group
  int group_channels;
  int lane;
  int lanes;
};

__device__ Place place_of(int64_t channels) {
  const int group_channels = static_cast<int>(channels < kGroupChannels ? channels : kGroupChannels);
  const int vectors = group_channels / kVector;
  const int channel_in_group = static_cast<int>(threadIdx.x % vectors) * kVector;
  return {static_cast<int64_t>(blockIdx.y) * group_channels + channel_in_group, channel_in_group, group_channels,
          static_cast<int>(threadIdx.x / vectors), kThreads / vectors};
}

/// The i-th row of the thread's share, or -1 past the tensor's end.
__device__ int64_t row_of(const Place& place, int i, int64_t rows) {
  const int64_t row = (static_cast<int64_t>(i) * gridDim.x + blockIdx.x) * place.lanes + place.lane;
  return row < rows ? row : -1;
}

/// 8 elements at `base` + `offset` (16-byte aligned), as loaded. Only for memory no thread of
/// this kernel writes (read through the non-coherent cache).
template <typename T>
__device__ inline uint4 load_raw(const void* base, int64_t offset) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(base) + offset));
}

template <typename T>
__device__ inline void unpack(const uint4& raw, float (&out)[kVector]) {
  const T* elements = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k) out[k] = to_float(elements[k]);
}

template <typename T>
__device__ inline uint4 pack(const float (&in)[kVector]) {
  uint4 raw;
  T* elements = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k) elements[k] = from_float<T>(in[k]);
  return raw;
}

template <typename T>
__device__ inline void store_raw(void* base, int64_t offset, const uint4& raw) {
  *reinterpret_cast<uint4*>(static_cast<T*>(base) + offset) = raw;
}

/// Turns each thread's partial sums over its rows (first[], second[] for its 8 channels) into
/// the sums over all rows: the block adds up its lanes (shuffles within each warp, then the warps
/// through shared memory), adds its sums into the accumulators, and meets the grid.
__device__ void sum_over_rows(float (&first)[kVector], float (&second)[kVector], const Place& place, int64_t channels,
                              Accumulators* accumulators) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_sums[2][kWarps * kGroupChannels];  // [which][warp * group_channels + channel]
  const unsigned int parity = __ldcg(&accumulators->parity);
  float* sums = accumulators->sums[parity];
  const bool first_block = blockIdx.x == 0 && blockIdx.y == 0;
  if (first_block) {
    for (int i = threadIdx.x; i < 2 * kMaxChannels; i += kThreads) accumulators->sums[parity ^ 1u][i] = 0.0f;
  }
  // A warp holds 32 / vectors lanes of the same channels.
  const int vectors = place.group_channels / kVector;
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    for (int offset = vectors; offset < 32; offset *= 2) {
      first[k] += __shfl_xor_sync(0xffffffffu, first[k], offset);
      second[k] += __shfl_xor_sync(0xffffffffu, second[k], offset);
    }
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (static_cast<int>(threadIdx.x % 32) < vectors) {
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      warp_sums[0][warp * place.group_channels + place.channel_in_group + k] = first[k];
      warp_sums[1][warp * place.group_channels + place.channel_in_group + k] = second[k];
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < 2 * place.group_channels) {
    const int which = static_cast<int>(threadIdx.x) / place.group_channels;
    const int channel = static_cast<int>(threadIdx.x) % place.group_channels;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[which][w * place.group_channels + channel];
    atomicAdd(&sums[which * channels + blockIdx.y * place.group_channels + channel], total);
  }
  cg::this_grid().sync();  // fences first: every block's additions are in, and every block has read the parity
  if (first_block && threadIdx.x == 0) accumulators->parity = parity ^ 1u;
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    first[k] = __ldcg(&sums[place.first_channel + k]);
    second[k] = __ldcg(&sums[channels + place.first_channel + k]);
  }
}

// The first pass loads a thread's rows into registers and sums them, the blocks meet, and the
// second pass writes the elementwise result from the registers: the tensor is read once.

template <typename T, BatchNormActivation kActivation>
__global__ void __launch_bounds__(kThreads, 2) forward_kernel(BatchNormShape shape, BatchNormForward a,
                                                           Accumulators* accumulators) {
  const int64_t channels = shape.channels;
  const Place place = place_of(channels);
  uint4 x_rows[kRowsPerThread], residual_rows[kRowsPerThread];
  int64_t rows[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    rows[i] = row_of(place, i, shape.rows);
    if (rows[i] < 0) continue;
    x_rows[i] = load_raw<T>(a.x, rows[i] * channels + place.first_channel);
    if (kActivation == BatchNormActivation::add_relu)
      residual_rows[i] = load_raw<T>(a.residual, rows[i] * channels + place.first_channel);
  }
  // Sums of x - x[row 0] rather than of x: a channel's mean can be large beside its spread, and
  // E[d^2] - E[d]^2 then cancels less.
  float shift[kVector];
  unpack<T>(load_raw<T>(a.x, place.first_channel), shift);
  float sum[kVector] = {}, sum_of_squares[kVector] = {};
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (rows[i] < 0) continue;
    float x[kVector];
    unpack<T>(x_rows[i], x);
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      const float d = x[k] - shift[k];
      sum[k] += d;
      sum_of_squares[k] += d * d;
    }
  }
  float scale[kVector], offset[kVector];  // y = x * scale + offset before the activation
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    scale[k] = a.weight[place.first_channel + k];  // loaded before the barrier, to overlap its wait
    offset[k] = a.bias[place.first_channel + k];
  }
  sum_over_rows(sum, sum_of_squares, place, channels, accumulators);

  // float32 throughout, as ATen's kernels: every thread computes its 8 channels.
  const bool writes_statistics = blockIdx.x == 0 && place.lane == 0;
  const float count = static_cast<float>(shape.rows);
  const float momentum = static_cast<float>(a.momentum);
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    const float shifted_mean = sum[k] / count;
    const float variance = fmaxf(sum_of_squares[k] / count - shifted_mean * shifted_mean, 0.0f);  // biased
    const float mean = shift[k] + shifted_mean;
    const float inv_std = 1.0f / sqrtf(variance + static_cast<float>(a.eps));
    scale[k] *= inv_std;
    offset[k] -= mean * scale[k];
    if (writes_statistics) {
      const int64_t channel = place.first_channel + k;
      a.saved_mean[channel] = mean;
      a.saved_inv_std[channel] = inv_std;
      a.running_mean[channel] = (1.0f - momentum) * a.running_mean[channel] + momentum * mean;
      a.running_var[channel] =
          (1.0f - momentum) * a.running_var[channel] + momentum * variance * (count / (count - 1.0f));
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (rows[i] < 0) continue;
    float values[kVector], residual[kVector];
    unpack<T>(x_rows[i], values);
    if (kActivation == BatchNormActivation::add_relu) unpack<T>(residual_rows[i], residual);
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      float value = values[k] * scale[k] + offset[k];
      if (kActivation == BatchNormActivation::add_relu) value += residual[k];
      // fmaxf would turn NaN into 0; ReLU keeps it, as torch's does.
      if (kActivation != BatchNormActivation::none) value = value > 0.0f || value != value ? value : 0.0f;
      values[k] = value;
    }
    store_raw<T>(a.y, rows[i] * channels + place.first_channel, pack<T>(values));
  }
}

template <typename T, BatchNormActivation kActivation>
__global__ void __launch_bounds__(kThreads, 2) backward_kernel(BatchNormShape shape, BatchNormBackward a,
                                                            Accumulators* accumulators) {
  const int64_t channels = shape.channels;
  const Place place = place_of(channels);
  // Per row: g, the gradient after the activation (grad_y where y > 0 after a ReLU: torch's
  // threshold_backward, where NaN outputs pass no gradient; exact in T), and x.
  uint4 gradient_rows[kRowsPerThread], x_rows[kRowsPerThread];
  int64_t rows[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    rows[i] = row_of(place, i, shape.rows);
    if (rows[i] < 0) continue;
    const int64_t at = rows[i] * channels + place.first_channel;
    gradient_rows[i] = load_raw<T>(a.grad_y, at);
    x_rows[i] = load_raw<T>(a.x, at);
    if (kActivation != BatchNormActivation::none) {
      const uint4 y_raw = load_raw<T>(a.y, at);
      const T* y = reinterpret_cast<const T*>(&y_raw);
      T* gradient = reinterpret_cast<T*>(&gradient_rows[i]);
#pragma unroll
      for (int k = 0; k < kVector; ++k)
        if (!(to_float(y[k]) > 0.0f)) gradient[k] = from_float<T>(0.0f);
    }
  }
  float mean[kVector], inv_std[kVector], weight[kVector];
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    mean[k] = a.saved_mean[place.first_channel + k];
    inv_std[k] = a.saved_inv_std[place.first_channel + k];
    weight[k] = a.weight[place.first_channel + k];
  }
  // Per channel: sum of g, and of g * (x - mean).
  float sum[kVector] = {}, sum_times_centered[kVector] = {};
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (rows[i] < 0) continue;
    if (kActivation == BatchNormActivation::add_relu)
      store_raw<T>(a.grad_residual, rows[i] * channels + place.first_channel, gradient_rows[i]);
    float gradient[kVector], x[kVector];
    unpack<T>(gradient_rows[i], gradient);
    unpack<T>(x_rows[i], x);
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      sum[k] += gradient[k];
      sum_times_centered[k] += gradient[k] * (x[k] - mean[k]);
    }
  }
  sum_over_rows(sum, sum_times_centered, place, channels, accumulators);

  // grad_x = w * inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), x_hat = (x - mean) * inv_std,
  // with mean(g) = grad_bias / rows and mean(g * x_hat) = grad_weight / rows:
  // grad_x = gain * g + slope * (x - mean) + constant.
  const bool writes_gradients = blockIdx.x == 0 && place.lane == 0;
  float gain[kVector], slope[kVector], constant[kVector];
  const float count = static_cast<float>(shape.rows);
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    const float grad_weight = sum_times_centered[k] * inv_std[k];
    if (writes_gradients) {
      a.grad_bias[place.first_channel + k] = sum[k];
      a.grad_weight[place.first_channel + k] = grad_weight;
    }
    gain[k] = weight[k] * inv_std[k];
    slope[k] = -gain[k] * inv_std[k] * (grad_weight / count);
    constant[k] = -gain[k] * (sum[k] / count);
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (rows[i] < 0) continue;
    float gradient[kVector], x[kVector];
    unpack<T>(gradient_rows[i], gradient);
    unpack<T>(x_rows[i], x);
#pragma unroll
    for (int k = 0; k < kVector; ++k) gradient[k] = gain[k] * gradient[k] + slope[k] * (x[k] - mean[k]) + constant[k];
    store_raw<T>(a.grad_x, rows[i] * channels + place.first_channel, pack<T>(gradient));
  }
}

/// The forward and backward kernels of one element type and activation.
struct KernelPair {
  const void* forward;
  const void* backward;
};

template <typename T, BatchNormActivation kActivation>
KernelPair kernels_of() {
  return {reinterpret_cast<const void*>(&forward_kernel<T, kActivation>),
          reinterpret_cast<const void*>(&backward_kernel<T, kActivation>)};
}

template <typename T>
KernelPair kernels_of(BatchNormActivation activation) {
  switch (activation) {
    case BatchNormActivation::none: return kernels_of<T, BatchNormActivation::none>();
    case BatchNormActivation::relu: return kernels_of<T, BatchNormActivation::relu>();
    case BatchNormActivation::add_relu: return kernels_of<T, BatchNormActivation::add_relu>();
  }
  return {nullptr, nullptr};
}

KernelPair kernels_of(ElementType type, BatchNormActivation activation) {
  if (type == ElementType::float16) return kernels_of<__half>(activation);
  if (type == ElementType::bfloat16) return kernels_of<__nv_bfloat16>(activation);
  return {nullptr, nullptr};
}

/// How many blocks of `kernel` fit on the current device at once (a cooperative launch may not
/// ask for more), cached per kernel and device.
int resident_blocks(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find({kernel, device});
  if (found != cache.end()) return found->second;
  int per_sm = 0, sms = 0, cooperative = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error behind: the caller falls back
    per_sm = 0;
  }
  const int blocks = cooperative ? std::min(per_sm, kMaxBlocksPerSm) * sms : 0;
  cache.emplace(std::make_pair(kernel, device), blocks);
  return blocks;
}

/// The row groups (gridDim.x) both kernels of (type, activation) use for `shape`: enough to give
/// each thread at most kRowsPerThread rows; 0 where that grid would not fit on the device at once.
int64_t row_groups(ElementType type, BatchNormActivation activation, const BatchNormShape& shape) {
  const KernelPair pair = kernels_of(type, activation);
  if (pair.forward == nullptr) return 0;
  const int64_t channel_groups = shape.channels / group_channels_of(shape.channels);
  const int64_t resident = std::min(resident_blocks(pair.forward), resident_blocks(pair.backward));
  const int64_t lanes = kThreads / (group_channels_of(shape.channels) / kVector);
  const int64_t wanted = (shape.rows + lanes * kRowsPerThread - 1) / (lanes * kRowsPerThread);
  return wanted * channel_groups <= resident ? wanted : 0;
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

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

template <typename Arguments>
cudaError_t launch(const void* kernel, const BatchNormShape& shape, int64_t row_groups, const Arguments& arguments,
                   cudaStream_t stream) {
  Accumulators* accumulators = accumulators_for(stream);
  if (accumulators == nullptr || row_groups == 0) return cudaErrorNotSupported;
  BatchNormShape shape_argument = shape;
  Arguments kernel_arguments = arguments;
  void* parameters[] = {&shape_argument, &kernel_arguments, &accumulators};
  const dim3 grid(static_cast<unsigned>(row_groups),
                  static_cast<unsigned>(shape.channels / group_channels_of(shape.channels)));
  return cudaLaunchCooperativeKernel(kernel, grid, dim3(kThreads), parameters, 0, stream);
}

}  // namespace

bool batch_norm_nhwc_supported(ElementType type, const BatchNormShape& shape, cudaStream_t stream) {
  if (type != ElementType::float16 && type != ElementType::bfloat16) return false;
  if (!is_power_of_two(shape.channels) || shape.channels < kVector || shape.channels > kMaxChannels) return false;
  if (shape.rows < 2) return false;
  for (const auto activation : {BatchNormActivation::none, BatchNormActivation::relu, BatchNormActivation::add_relu})
    if (row_groups(type, activation, shape) == 0) return false;
  return accumulators_for(stream) != nullptr;
}

cudaError_t batch_norm_nhwc_forward(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                                    const BatchNormForward& arguments, cudaStream_t stream) {
  return launch(kernels_of(type, activation).forward, shape, row_groups(type, activation, shape), arguments, stream);
}

cudaError_t batch_norm_nhwc_backward(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                                     const BatchNormBackward& arguments, cudaStream_t stream) {
  return launch(kernels_of(type, activation).backward, shape, row_groups(type, activation, shape), arguments, stream);
}

}  // namespace ltrain::kernels
