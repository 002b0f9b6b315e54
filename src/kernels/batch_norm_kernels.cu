// The device side of ltrain's BatchNorm over NHWC tensors: the register and streaming kernels, forward
// and backward, and the device helpers they share. The host side (planning, caches, launches) is
// batch_norm.cu; it reaches these kernels only through kernels_of() (batch_norm_kernels.cuh).
#include "batch_norm_kernels.cuh"

#include <cooperative_groups.h>

#include "element_access.cuh"

namespace ltrain::kernels::batch_norm_detail {
namespace {

namespace cg = cooperative_groups;

/// A thread's share of [rows, channels]. The grid is (row groups, channel groups), group_channels =
/// channels / gridDim.y (from kVector to kGroupChannels, the launcher's choice): block (r, g)
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
  const int group_channels = static_cast<int>(channels / gridDim.y);
  const int vectors = group_channels / kVector;
  const int channel_in_group = static_cast<int>(threadIdx.x % vectors) * kVector;
  return {static_cast<int64_t>(blockIdx.y) * group_channels + channel_in_group, channel_in_group, group_channels,
          static_cast<int>(threadIdx.x / vectors), kThreads / vectors};
}

/// The i-th row of the thread's share (may be past the tensor's end).
__device__ int64_t row_of(const Place& place, int i) {
  return (static_cast<int64_t>(i) * gridDim.x + blockIdx.x) * place.lanes + place.lane;
}

/// Where the i-th row of the thread's share starts its 8 channels (an element index), or -1 past
/// the tensor's end. Recomputed where needed rather than kept: registers hold the rows' values.
__device__ int64_t element_of(const Place& place, int i, const BatchNormShape& shape) {
  const int64_t row = row_of(place, i);
  return row < shape.rows ? row * shape.channels + place.first_channel : -1;
}

/// The byte of the ReLU's mask that holds the thread's 8 channels of the i-th row of its share. The
/// mask is [channel groups, rows, group channels / 8] bytes, bit k of a byte for its k-th channel: a
/// warp's 32 threads (rows next to each other, 8 channels each) reach 32 adjacent bytes.
__device__ int64_t mask_byte_of(const Place& place, int i, const BatchNormShape& shape) {
  const int bytes_per_row = place.group_channels / kVector;
  return (static_cast<int64_t>(blockIdx.y) * shape.rows + row_of(place, i)) * bytes_per_row +
         place.channel_in_group / kVector;
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

/// a + b elementwise, each sum rounded to T once.
template <typename T>
__device__ inline uint4 add_raw(const uint4& a, const uint4& b) {
  float left[kVector], right[kVector];
  unpack<T>(a, left);
  unpack<T>(b, right);
#pragma unroll
  for (int k = 0; k < kVector; ++k) left[k] += right[k];
  return pack<T>(left);
}

template <typename T>
__device__ inline void store_raw(void* base, int64_t offset, const uint4& raw) {
  *reinterpret_cast<uint4*>(static_cast<T*>(base) + offset) = raw;
}

/// Adds up the block's lanes of each thread's partial sums over its rows (first[], second[] for
/// its 8 channels): shuffles within each warp, then the warps through shared memory. Returns, in
/// threads below 2 * group_channels, the block's sum of [which = thread / group_channels]
/// [channel = thread % group_channels]; 0 elsewhere.
__device__ float sum_over_block(float (&first)[kVector], float (&second)[kVector], const Place& place) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_sums[2][kWarps * kGroupChannels];  // [which][warp * group_channels + channel]
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
  float total = 0.0f;
  if (static_cast<int>(threadIdx.x) < 2 * place.group_channels) {
    const int which = static_cast<int>(threadIdx.x) / place.group_channels;
    const int channel = static_cast<int>(threadIdx.x) % place.group_channels;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[which][w * place.group_channels + channel];
  }
  return total;
}

/// The sums over all rows of one channel.
struct ChannelSums {
  float first = 0.0f;
  float second = 0.0f;
};

/// Whether this thread is its block's channel thread for channel threadIdx.x of the group: the
/// one that turns that channel's sums into what every thread of the block needs of it.
__device__ inline bool is_channel_thread(const Place& place) {
  return static_cast<int>(threadIdx.x) < place.group_channels;
}

/// The channel thread's channel in the tensor.
__device__ inline int64_t own_channel(const Place& place) {
  return static_cast<int64_t>(blockIdx.y) * place.group_channels + threadIdx.x;
}

/// Adds up each thread's partial sums over its rows (first[], second[] for its 8 channels) over all
/// rows, and returns them in the channel threads (is_channel_thread), for their own channel.
/// Reduction::cluster: the row groups of a channel group are one thread-block cluster; each block
/// adds up the cluster's block sums from distributed shared memory, in rank order (repeatable).
/// The caller ends with finish_sums(), so that no block leaves while another still reads it.
/// Reduction::grid: the blocks add their sums into the accumulators and meet the whole grid.
template <Reduction kReduction>
__device__ ChannelSums sum_over_rows(float (&first)[kVector], float (&second)[kVector], const Place& place,
                                     int64_t channels, Accumulators* accumulators) {
  const bool summing_thread = static_cast<int>(threadIdx.x) < 2 * place.group_channels;
  ChannelSums totals;
  if constexpr (kReduction == Reduction::cluster) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    __shared__ float block_sums[2 * kGroupChannels];    // [which * group_channels + channel], this block's
    __shared__ float cluster_sums[2 * kGroupChannels];  // ... and the cluster's
    const float block_sum = sum_over_block(first, second, place);
    if (summing_thread) block_sums[threadIdx.x] = block_sum;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's sums are in its shared memory
    if (summing_thread) {
      float total = 0.0f;
      for (unsigned int rank = 0; rank < cluster.num_blocks(); ++rank)
        total += *cluster.map_shared_rank(&block_sums[threadIdx.x], rank);
      cluster_sums[threadIdx.x] = total;
    }
    cluster.barrier_arrive();  // done reading the other blocks; finish_sums() waits for them all
    __syncthreads();
    if (is_channel_thread(place)) {
      totals.first = cluster_sums[threadIdx.x];
      totals.second = cluster_sums[place.group_channels + threadIdx.x];
    }
#else
    __trap();  // clusters need sm_90; the host side launches this only on such devices
#endif
  } else {
    const unsigned int parity = __ldcg(&accumulators->parity);
    float* sums = accumulators->sums[parity];
    const bool first_block = blockIdx.x == 0 && blockIdx.y == 0;
    if (first_block) {
      for (int i = threadIdx.x; i < 2 * kMaxChannels; i += kThreads) accumulators->sums[parity ^ 1u][i] = 0.0f;
    }
    const float block_sum = sum_over_block(first, second, place);
    if (summing_thread) {
      const int which = static_cast<int>(threadIdx.x) / place.group_channels;
      const int channel = static_cast<int>(threadIdx.x) % place.group_channels;
      atomicAdd(&sums[which * channels + blockIdx.y * place.group_channels + channel], block_sum);
    }
    cg::this_grid().sync();  // fences first: every block's additions are in, and every block has read the parity
    if (first_block && threadIdx.x == 0) accumulators->parity = parity ^ 1u;
    if (is_channel_thread(place)) {
      totals.first = __ldcg(&sums[own_channel(place)]);
      totals.second = __ldcg(&sums[channels + own_channel(place)]);
    }
  }
  return totals;
}

/// The end of a kernel that called sum_over_rows: a cluster's blocks wait until all have read
/// each other's sums (their shared memory lives as long as the block).
template <Reduction kReduction>
__device__ void finish_sums() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  if constexpr (kReduction == Reduction::cluster) cg::this_cluster().barrier_wait();
#endif
}

/// Hands each thread its 8 channels' values of what the channel threads computed, `own` of
/// channel threadIdx.x: kValues per channel, through shared memory (a block barrier). Each
/// channel's division and square root then run once a block rather than in every lane.
template <int kValues>
__device__ void share_channel_values(const float (&own)[kValues], const Place& place,
                                     float (&values)[kValues][kVector]) {
  __shared__ float shared[kValues][kGroupChannels];  // [value][channel in group]
  if (is_channel_thread(place)) {
#pragma unroll
    for (int n = 0; n < kValues; ++n) shared[n][threadIdx.x] = own[n];
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < kValues; ++n) {
#pragma unroll
    for (int k = 0; k < kVector; ++k) values[n][k] = shared[n][place.channel_in_group + k];
  }
}

// Per-row and per-channel steps that the register kernels and the streaming kernels share.

/// The thread's 8 channels of a per-channel float32 vector (weight, bias, saved statistics).
__device__ __forceinline__ void load_channels(const float* values, const Place& place, float (&out)[kVector]) {
#pragma unroll
  for (int k = 0; k < kVector; ++k) out[k] = values[place.first_channel + k];
}

/// Adds one row's 8 channels, as d = x - shift, into the sums of d and d^2.
template <typename T>
__device__ __forceinline__ void add_shifted_row(const uint4& x_raw, const float (&shift)[kVector], float (&sum)[kVector],
                                                float (&sum_of_squares)[kVector]) {
  float x[kVector];
  unpack<T>(x_raw, x);
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    const float d = x[k] - shift[k];
    sum[k] += d;
    sum_of_squares[k] += d * d;
  }
}

/// The normalization as y = x * scale + offset: scale = weight * inv_std, offset = bias - mean *
/// scale. Each rounding is spelled out (no contraction left to the compiler), so that a backward
/// recomputing y from x and the saved statistics gets the forward's values bit for bit.
__device__ __forceinline__ void affine_of(float weight, float bias, float mean, float inv_std, float& scale,
                                          float& offset) {
  scale = __fmul_rn(weight, inv_std);
  offset = __fmaf_rn(-mean, scale, bias);
}

/// x * scale + offset, what the activation sees, rounded once.
__device__ __forceinline__ float affine(float x, float scale, float offset) { return __fmaf_rn(x, scale, offset); }

/// What a channel thread loads of its channel before the blocks meet, to overlap their wait: for
/// the forward the first row's x (the shift of the sums), the weight and the bias; for the
/// backward the saved inverse standard deviation and the weight.
struct ChannelInputs {
  float shift = 0.0f;
  float weight = 0.0f;
  float bias = 0.0f;
  float inv_std = 0.0f;
};

/// The channel thread's y = x * scale + offset before the activation ({scale, offset}), from the
/// sums over all rows of d = x - shift and d^2 of its channel. Row group 0 writes the batch
/// statistics and moves the running ones. float32 throughout, as ATen's kernels.
__device__ __forceinline__ void normalize_channel(const ChannelSums& sums, const ChannelInputs& inputs,
                                                  const Place& place, const BatchNormShape& shape,
                                                  const BatchNormForward& a, float (&affine)[2]) {
  const float count = static_cast<float>(shape.rows);
  const float shifted_mean = sums.first / count;
  const float variance = fmaxf(sums.second / count - shifted_mean * shifted_mean, 0.0f);  // biased
  const float mean = inputs.shift + shifted_mean;
  const float inv_std = 1.0f / sqrtf(variance + static_cast<float>(a.eps));
  affine_of(inputs.weight, inputs.bias, mean, inv_std, affine[0], affine[1]);
  if (blockIdx.x == 0) {
    const int64_t channel = own_channel(place);
    const float momentum = static_cast<float>(a.momentum);
    a.saved_mean[channel] = mean;
    a.saved_inv_std[channel] = inv_std;
    a.running_mean[channel] = (1.0f - momentum) * a.running_mean[channel] + momentum * mean;
    a.running_var[channel] =
        (1.0f - momentum) * a.running_var[channel] + momentum * variance * (count / (count - 1.0f));
  }
}

/// Every thread's scale and offset of its 8 channels (affine[0], affine[1]), from the channel
/// threads' normalize_channel: the sums over all rows of d = x - shift and d^2.
__device__ __forceinline__ void normalize_statistics(const ChannelSums& sums, const ChannelInputs& inputs,
                                                     const Place& place, const BatchNormShape& shape,
                                                     const BatchNormForward& a, float (&affine)[2][kVector]) {
  float own[2] = {};
  if (is_channel_thread(place)) normalize_channel(sums, inputs, place, shape, a, own);
  share_channel_values(own, place, affine);
}

/// The channel thread's forward inputs (ChannelInputs); zeros in the other threads.
template <typename T>
__device__ __forceinline__ ChannelInputs forward_channel_inputs(const BatchNormForward& a, const Place& place,
                                                                bool shifted) {
  ChannelInputs inputs;
  if (!is_channel_thread(place)) return inputs;
  const int64_t channel = own_channel(place);
  if (shifted) inputs.shift = to_float(static_cast<const T*>(a.x)[channel]);
  inputs.weight = a.weight[channel];
  inputs.bias = a.bias[channel];
  return inputs;
}

/// One row of y: x * scale + offset, then the activation (residual: add_relu only).
template <typename T, BatchNormActivation kActivation>
__device__ __forceinline__ uint4 normalized_row(const uint4& x_raw, const uint4& residual_raw,
                                                const float (&scale)[kVector], const float (&offset)[kVector]) {
  float values[kVector], residual[kVector];
  unpack<T>(x_raw, values);
  if (kActivation == BatchNormActivation::add_relu) unpack<T>(residual_raw, residual);
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    float value = affine(values[k], scale[k], offset[k]);
    if (kActivation == BatchNormActivation::add_relu) value += residual[k];
    // fmaxf would turn NaN into 0; ReLU keeps it, as torch's does.
    if (kActivation != BatchNormActivation::none) value = value > 0.0f || value != value ? value : 0.0f;
    values[k] = value;
  }
  return pack<T>(values);
}

/// Bit k set where element k of the 8 is positive (NaN is not): the ReLU's mask of a row of y.
template <typename T>
__device__ __forceinline__ uint8_t positive_bits(const uint4& raw) {
  const T* elements = reinterpret_cast<const T*>(&raw);
  unsigned int bits = 0;
#pragma unroll
  for (int k = 0; k < kVector; ++k)
    if (to_float(elements[k]) > 0.0f) bits |= 1u << k;
  return static_cast<uint8_t>(bits);
}

/// Where the launch made this grid a programmatic dependent of the kernel before it (sm_90 and
/// later), its blocks may start while that kernel still runs: every kernel here waits for it
/// to complete, and for its writes to be visible, before touching memory. Without that launch
/// attribute, and before sm_90, the wait returns at once.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The first pass loads a thread's rows into registers and sums them, the blocks meet, and the
// second pass writes the elementwise result from the registers: the tensor is read once.

template <typename T, BatchNormActivation kActivation, Reduction kReduction>
__global__ void __launch_bounds__(kThreads, 2) forward_kernel(BatchNormShape shape, BatchNormForward a,
                                                           Accumulators* accumulators) {
  wait_for_prior_grid();
  const int64_t channels = shape.channels;
  const Place place = place_of(channels);
  uint4 x_rows[kRowsPerThread], residual_rows[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t at = element_of(place, i, shape);
    if (at < 0) continue;
    x_rows[i] = load_raw<T>(a.x, at);
    if (kActivation == BatchNormActivation::add_relu) residual_rows[i] = load_raw<T>(a.residual, at);
  }
  // Sums of x - x[row 0] rather than of x: a channel's mean can be large beside its spread, and
  // E[d^2] - E[d]^2 then cancels less.
  float shift[kVector];
  unpack<T>(load_raw<T>(a.x, place.first_channel), shift);
  float sum[kVector] = {}, sum_of_squares[kVector] = {};
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i)
    if (element_of(place, i, shape) >= 0) add_shifted_row<T>(x_rows[i], shift, sum, sum_of_squares);
  const ChannelInputs inputs = forward_channel_inputs<T>(a, place, /*shifted=*/true);
  const ChannelSums sums = sum_over_rows<kReduction>(sum, sum_of_squares, place, channels, accumulators);
  float affine[2][kVector];  // y = x * scale + offset before the activation
  normalize_statistics(sums, inputs, place, shape, a, affine);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t at = element_of(place, i, shape);
    if (at >= 0)
      store_raw<T>(a.y, at, normalized_row<T, kActivation>(x_rows[i], residual_rows[i], affine[0], affine[1]));
  }
  finish_sums<kReduction>();
}

/// grad_y for one row, plus grad_y_second where given.
template <typename T, bool kSecondGradient>
__device__ __forceinline__ uint4 incoming_gradient(const BatchNormBackward& a, int64_t at) {
  const uint4 gradient_raw = load_raw<T>(a.grad_y, at);
  if constexpr (kSecondGradient) return add_raw<T>(gradient_raw, load_raw<T>(a.grad_y_second, at));
  return gradient_raw;
}

/// Zeroes the gradient where the ReLU's output y is not positive: torch's threshold_backward, where
/// NaN outputs pass no gradient (exact in T).
template <typename T>
__device__ __forceinline__ void mask_by_relu(uint4& gradient_raw, const uint4& y_raw) {
  const T* y = reinterpret_cast<const T*>(&y_raw);
  T* gradient = reinterpret_cast<T*>(&gradient_raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k)
    if (!(to_float(y[k]) > 0.0f)) gradient[k] = from_float<T>(0.0f);
}

/// Zeroes the gradient where the forward's mask byte (positive_bits of y) has no bit: mask_by_relu
/// from 1 bit an element instead of y's 16.
template <typename T>
__device__ __forceinline__ void mask_by_bits(uint4& gradient_raw, uint8_t bits) {
  T* gradient = reinterpret_cast<T*>(&gradient_raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k)
    if (!(bits & (1u << k))) gradient[k] = from_float<T>(0.0f);
}

/// The forward's scale and offset (affine_of) of the thread's channels, from the saved statistics.
__device__ __forceinline__ void forward_affine(const BatchNormBackward& a, const Place& place,
                                               const float (&mean)[kVector], const float (&inv_std)[kVector],
                                               float (&scale)[kVector], float (&offset)[kVector]) {
  load_channels(a.weight, place, scale);
  load_channels(a.bias, place, offset);
#pragma unroll
  for (int k = 0; k < kVector; ++k) affine_of(scale[k], offset[k], mean[k], inv_std[k], scale[k], offset[k]);
}

/// Zeroes the gradient where the forward's y = relu(x * scale + offset), rounded to T, is not
/// positive: mask_by_relu's mask without reading y, from x, which the backward reads anyway. Exact:
/// y > 0 exactly where x * scale + offset rounds to a positive T (a NaN passes no gradient).
template <typename T>
__device__ __forceinline__ void mask_by_relu_of_x(uint4& gradient_raw, const uint4& x_raw, const float (&scale)[kVector],
                                                  const float (&offset)[kVector]) {
  float x[kVector];
  unpack<T>(x_raw, x);
  T* gradient = reinterpret_cast<T*>(&gradient_raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k)
    if (!(to_float(from_float<T>(affine(x[k], scale[k], offset[k]))) > 0.0f)) gradient[k] = from_float<T>(0.0f);
}

/// Adds one row's 8 channels into the sums of g and of g * (x - mean).
template <typename T>
__device__ __forceinline__ void add_gradient_row(const uint4& gradient_raw, const uint4& x_raw,
                                                 const float (&mean)[kVector], float (&sum)[kVector],
                                                 float (&sum_times_centered)[kVector]) {
  float gradient[kVector], x[kVector];
  unpack<T>(gradient_raw, gradient);
  unpack<T>(x_raw, x);
#pragma unroll
  for (int k = 0; k < kVector; ++k) {
    sum[k] += gradient[k];
    sum_times_centered[k] += gradient[k] * (x[k] - mean[k]);
  }
}

/// grad_x = w * inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), x_hat = (x - mean) * inv_std,
/// with mean(g) = grad_bias / rows and mean(g * x_hat) = grad_weight / rows:
/// grad_x = gain * g + slope * (x - mean) + constant. The channel thread's {gain, slope, constant}
/// from the sums over all rows of g and of g * (x - mean) of its channel; row group 0 writes
/// grad_weight and grad_bias.
__device__ __forceinline__ void channel_gradient_coefficients(const ChannelSums& sums, const ChannelInputs& inputs,
                                                              const Place& place, const BatchNormShape& shape,
                                                              const BatchNormBackward& a, float (&coefficients)[3]) {
  const float count = static_cast<float>(shape.rows);
  const float grad_weight = sums.second * inputs.inv_std;
  if (blockIdx.x == 0) {
    a.grad_bias[own_channel(place)] = sums.first;
    a.grad_weight[own_channel(place)] = grad_weight;
  }
  const float gain = inputs.weight * inputs.inv_std;
  coefficients[0] = gain;
  coefficients[1] = -gain * inputs.inv_std * (grad_weight / count);
  coefficients[2] = -gain * (sums.first / count);
}

/// Every thread's {gain, slope, constant} of its 8 channels, from the channel threads'
/// channel_gradient_coefficients.
__device__ __forceinline__ void input_gradient_coefficients(const ChannelSums& sums, const ChannelInputs& inputs,
                                                            const Place& place, const BatchNormShape& shape,
                                                            const BatchNormBackward& a,
                                                            float (&coefficients)[3][kVector]) {
  float own[3] = {};
  if (is_channel_thread(place)) channel_gradient_coefficients(sums, inputs, place, shape, a, own);
  share_channel_values(own, place, coefficients);
}

/// The channel thread's backward inputs (ChannelInputs); zeros in the other threads.
__device__ __forceinline__ ChannelInputs backward_channel_inputs(const BatchNormBackward& a, const Place& place) {
  ChannelInputs inputs;
  if (!is_channel_thread(place)) return inputs;
  inputs.inv_std = a.saved_inv_std[own_channel(place)];
  inputs.weight = a.weight[own_channel(place)];
  return inputs;
}

/// One row of grad_x from g and x.
template <typename T>
__device__ __forceinline__ uint4 input_gradient_row(const uint4& gradient_raw, const uint4& x_raw,
                                                    const float (&mean)[kVector], const float (&gain)[kVector],
                                                    const float (&slope)[kVector], const float (&constant)[kVector]) {
  float gradient[kVector], x[kVector];
  unpack<T>(gradient_raw, gradient);
  unpack<T>(x_raw, x);
#pragma unroll
  for (int k = 0; k < kVector; ++k) gradient[k] = gain[k] * gradient[k] + slope[k] * (x[k] - mean[k]) + constant[k];
  return pack<T>(gradient);
}

// kSecondGradient: grad_y_second is given (add_relu only). A template argument, not a test of the
// pointer: the test alone, compiled into every backward kernel, made all of them spill more and run
// slower, the ones that never get a second gradient included (measured: docs/BENCHMARKS.md).
template <typename T, BatchNormActivation kActivation, Reduction kReduction, bool kSecondGradient>
__global__ void __launch_bounds__(kThreads, 2) backward_kernel(BatchNormShape shape, BatchNormBackward a,
                                                            Accumulators* accumulators) {
  wait_for_prior_grid();
  const int64_t channels = shape.channels;
  const Place place = place_of(channels);
  // Per row: g, the gradient after the activation, and x. (x is loaded before y: loading y first
  // made nvcc spill far more.)
  uint4 gradient_rows[kRowsPerThread], x_rows[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t at = element_of(place, i, shape);
    if (at < 0) continue;
    gradient_rows[i] = incoming_gradient<T, kSecondGradient>(a, at);
    x_rows[i] = load_raw<T>(a.x, at);
    // The mask from y, not recomputed from x as the streaming kernel does: with the forward's scale
    // and offset beside 8 rows, nvcc 13.0 spilled 108-120 bytes a thread in bf16 instead of 40.
    if (kActivation != BatchNormActivation::none) mask_by_relu<T>(gradient_rows[i], load_raw<T>(a.y, at));
  }
  float mean[kVector];
  load_channels(a.saved_mean, place, mean);
  const ChannelInputs inputs = backward_channel_inputs(a, place);
  float sum[kVector] = {}, sum_times_centered[kVector] = {};
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i)
    if (element_of(place, i, shape) >= 0) add_gradient_row<T>(gradient_rows[i], x_rows[i], mean, sum, sum_times_centered);
  const ChannelSums sums = sum_over_rows<kReduction>(sum, sum_times_centered, place, channels, accumulators);
  float coefficients[3][kVector];  // gain, slope, constant
  input_gradient_coefficients(sums, inputs, place, shape, a, coefficients);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t at = element_of(place, i, shape);
    if (at < 0) continue;
    // Stored after the sums, not before: the grid barrier's fence would wait for these stores.
    if (kActivation == BatchNormActivation::add_relu) store_raw<T>(a.grad_residual, at, gradient_rows[i]);
    store_raw<T>(a.grad_x, at,
                 input_gradient_row<T>(gradient_rows[i], x_rows[i], mean, coefficients[0], coefficients[1],
                                       coefficients[2]));
  }
  finish_sums<kReduction>();
}

// Streaming: for tensors larger than one resident grid holds in registers (Reduction::streaming).
// Each thread reads its rows kStreamRows at a time and sums them, the whole grid meets as in
// Reduction::grid, and the second pass reads the rows again. The first pass goes last row first, to
// find in L2 (50 MB on an H200, beside 34 MB for a 16.8M-element fp16 tensor) what the kernel before
// it wrote last, and the second first row first, to find there what the first pass read last.
constexpr int kStreamRows = 4;
// Launch bounds of 2 blocks an SM (up to 128 registers): at 3 (80 registers) the backward spills,
// at 2 no streaming kernel does. 512 threads an SM, each with kStreamRows 16-byte loads of every
// input in flight, still cover HBM's latency.
constexpr int kStreamBlocksPerSm = 2;

/// How many rows of the tensor each thread covers in a streaming kernel.
__device__ inline int streamed_rows_of(const Place& place, const BatchNormShape& shape) {
  const int64_t rows_per_step = static_cast<int64_t>(gridDim.x) * place.lanes;
  return static_cast<int>((shape.rows + rows_per_step - 1) / rows_per_step);
}

/// The first row of the last group of kStreamRows (where the first pass starts).
__device__ inline int last_stream_step(int streamed_rows) {
  return streamed_rows == 0 ? -1 : (streamed_rows - 1) / kStreamRows * kStreamRows;
}

/// 8 elements this kernel's own thread stored earlier (read through L2, not the non-coherent cache).
template <typename T>
__device__ inline uint4 load_stored(const void* base, int64_t offset) {
  return __ldcg(reinterpret_cast<const uint4*>(static_cast<const T*>(base) + offset));
}

template <typename T, BatchNormActivation kActivation>
__global__ void __launch_bounds__(kThreads, kStreamBlocksPerSm)
    streaming_forward_kernel(BatchNormShape shape, BatchNormForward a, Accumulators* accumulators) {
  wait_for_prior_grid();
  const Place place = place_of(shape.channels);
  const int streamed_rows = streamed_rows_of(place, shape);
  float shift[kVector];  // as in forward_kernel: sums around each channel's first value
  unpack<T>(load_raw<T>(a.x, place.first_channel), shift);
  float sum[kVector] = {}, sum_of_squares[kVector] = {};
  for (int step = last_stream_step(streamed_rows); step >= 0; step -= kStreamRows) {
    uint4 x_rows[kStreamRows];
#pragma unroll
    for (int j = kStreamRows - 1; j >= 0; --j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at >= 0) x_rows[j] = load_raw<T>(a.x, at);
    }
#pragma unroll
    for (int j = kStreamRows - 1; j >= 0; --j)
      if (element_of(place, step + j, shape) >= 0) add_shifted_row<T>(x_rows[j], shift, sum, sum_of_squares);
  }
  const ChannelInputs inputs = forward_channel_inputs<T>(a, place, /*shifted=*/true);
  const ChannelSums sums = sum_over_rows<Reduction::grid>(sum, sum_of_squares, place, shape.channels, accumulators);
  float affine[2][kVector];  // y = x * scale + offset before the activation
  normalize_statistics(sums, inputs, place, shape, a, affine);
  const float(&scale)[kVector] = affine[0];
  const float(&offset)[kVector] = affine[1];
  for (int step = 0; step < streamed_rows; step += kStreamRows) {
    uint4 x_rows[kStreamRows], residual_rows[kStreamRows];
#pragma unroll
    for (int j = 0; j < kStreamRows; ++j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      x_rows[j] = load_raw<T>(a.x, at);
      if (kActivation == BatchNormActivation::add_relu) residual_rows[j] = load_raw<T>(a.residual, at);
    }
#pragma unroll
    for (int j = 0; j < kStreamRows; ++j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      const uint4 y_raw = normalized_row<T, kActivation>(x_rows[j], residual_rows[j], scale, offset);
      store_raw<T>(a.y, at, y_raw);
      if (kActivation == BatchNormActivation::add_relu)
        a.relu_mask[mask_byte_of(place, step + j, shape)] = positive_bits<T>(y_raw);
    }
  }
}

// After add_relu the first pass takes the ReLU's mask from the forward's bits (1 bit an element, not
// y), stores g in grad_residual (its value) and the second pass reads it back; after relu both
// passes read grad_y and x and recompute the ReLU's mask from x (no read of y, no store of g);
// without an activation g is grad_y.
template <typename T, BatchNormActivation kActivation, bool kSecondGradient>
__global__ void __launch_bounds__(kThreads, kStreamBlocksPerSm)
    streaming_backward_kernel(BatchNormShape shape, BatchNormBackward a, Accumulators* accumulators) {
  wait_for_prior_grid();
  const Place place = place_of(shape.channels);
  const int streamed_rows = streamed_rows_of(place, shape);
  float mean[kVector];
  load_channels(a.saved_mean, place, mean);
  float scale[kVector], offset[kVector];  // relu: the forward's, for its mask
  if constexpr (kActivation == BatchNormActivation::relu) {
    float inv_std[kVector];
    load_channels(a.saved_inv_std, place, inv_std);
    forward_affine(a, place, mean, inv_std, scale, offset);
  }
  float sum[kVector] = {}, sum_times_centered[kVector] = {};
  for (int step = last_stream_step(streamed_rows); step >= 0; step -= kStreamRows) {
    uint4 gradient_rows[kStreamRows], x_rows[kStreamRows];
#pragma unroll
    for (int j = kStreamRows - 1; j >= 0; --j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      gradient_rows[j] = incoming_gradient<T, kSecondGradient>(a, at);
      x_rows[j] = load_raw<T>(a.x, at);
      if (kActivation == BatchNormActivation::add_relu)
        mask_by_bits<T>(gradient_rows[j], __ldg(a.relu_mask + mask_byte_of(place, step + j, shape)));
    }
#pragma unroll
    for (int j = kStreamRows - 1; j >= 0; --j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      if (kActivation == BatchNormActivation::relu) mask_by_relu_of_x<T>(gradient_rows[j], x_rows[j], scale, offset);
      if (kActivation == BatchNormActivation::add_relu) store_raw<T>(a.grad_residual, at, gradient_rows[j]);
      add_gradient_row<T>(gradient_rows[j], x_rows[j], mean, sum, sum_times_centered);
    }
  }
  const ChannelInputs inputs = backward_channel_inputs(a, place);
  const ChannelSums sums = sum_over_rows<Reduction::grid>(sum, sum_times_centered, place, shape.channels, accumulators);
  float coefficients[3][kVector];  // gain, slope, constant
  input_gradient_coefficients(sums, inputs, place, shape, a, coefficients);
  for (int step = 0; step < streamed_rows; step += kStreamRows) {
    uint4 gradient_rows[kStreamRows], x_rows[kStreamRows];
#pragma unroll
    for (int j = 0; j < kStreamRows; ++j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      gradient_rows[j] = kActivation == BatchNormActivation::add_relu ? load_stored<T>(a.grad_residual, at)
                                                                       : load_raw<T>(a.grad_y, at);
      x_rows[j] = load_raw<T>(a.x, at);
    }
#pragma unroll
    for (int j = 0; j < kStreamRows; ++j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      if (kActivation == BatchNormActivation::relu) mask_by_relu_of_x<T>(gradient_rows[j], x_rows[j], scale, offset);
      store_raw<T>(a.grad_x, at,
                   input_gradient_row<T>(gradient_rows[j], x_rows[j], mean, coefficients[0], coefficients[1],
                                         coefficients[2]));
    }
  }
}

// With the statistics given: the sums of x and x^2 over the rows came from the convolution that
// wrote x (kernels/fused_conv.h), so no block waits for another. Each block turns the sums into its
// channels' scale and offset, then streams its rows once, kStreamRows at a time, last row first
// (as the streaming kernels' first pass); any grid size.
template <typename T, BatchNormActivation kActivation>
__global__ void __launch_bounds__(kThreads) given_statistics_forward_kernel(BatchNormShape shape, BatchNormForward a) {
  wait_for_prior_grid();
  const Place place = place_of(shape.channels);
  // Sums of x itself (shift 0): the convolution's epilogue has no first row to centre on. In
  // float32, E[x^2] - E[x]^2 loses about 1e-7 of E[x^2], far below the inputs' own rounding.
  const ChannelInputs inputs = forward_channel_inputs<T>(a, place, /*shifted=*/false);
  ChannelSums sums;
  if (is_channel_thread(place)) {
    sums.first = a.sum[own_channel(place)];
    sums.second = a.square_sum[own_channel(place)];
  }
  float affine[2][kVector];  // y = x * scale + offset before the activation
  normalize_statistics(sums, inputs, place, shape, a, affine);
  const float(&scale)[kVector] = affine[0];
  const float(&offset)[kVector] = affine[1];
  const int streamed_rows = streamed_rows_of(place, shape);
  for (int step = last_stream_step(streamed_rows); step >= 0; step -= kStreamRows) {
    uint4 x_rows[kStreamRows], residual_rows[kStreamRows];
#pragma unroll
    for (int j = kStreamRows - 1; j >= 0; --j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      x_rows[j] = load_raw<T>(a.x, at);
      if (kActivation == BatchNormActivation::add_relu) residual_rows[j] = load_raw<T>(a.residual, at);
    }
#pragma unroll
    for (int j = kStreamRows - 1; j >= 0; --j) {
      const int64_t at = element_of(place, step + j, shape);
      if (at < 0) continue;
      const uint4 y_raw = normalized_row<T, kActivation>(x_rows[j], residual_rows[j], scale, offset);
      store_raw<T>(a.y, at, y_raw);
      // The mask for a streaming backward, where the shape's plan streams (batch_norm_relu_mask_bytes).
      if (kActivation == BatchNormActivation::add_relu && a.relu_mask != nullptr)
        a.relu_mask[mask_byte_of(place, step + j, shape)] = positive_bits<T>(y_raw);
    }
  }
}

template <typename T, BatchNormActivation kActivation, Reduction kReduction>
KernelSet register_kernels_of() {
  KernelSet kernels{reinterpret_cast<const void*>(&forward_kernel<T, kActivation, kReduction>),
                     reinterpret_cast<const void*>(&backward_kernel<T, kActivation, kReduction, false>)};
  if constexpr (kActivation == BatchNormActivation::add_relu)
    kernels.backward_second = reinterpret_cast<const void*>(&backward_kernel<T, kActivation, kReduction, true>);
  return kernels;
}

template <typename T, BatchNormActivation kActivation>
KernelSet streaming_kernels_of() {
  KernelSet kernels{reinterpret_cast<const void*>(&streaming_forward_kernel<T, kActivation>),
                    reinterpret_cast<const void*>(&streaming_backward_kernel<T, kActivation, false>)};
  if constexpr (kActivation == BatchNormActivation::add_relu)
    kernels.backward_second = reinterpret_cast<const void*>(&streaming_backward_kernel<T, kActivation, true>);
  return kernels;
}

template <typename T, BatchNormActivation kActivation, Reduction kReduction>
KernelSet kernels_of_reduction() {
  if constexpr (kReduction == Reduction::streaming) return streaming_kernels_of<T, kActivation>();
  else return register_kernels_of<T, kActivation, kReduction>();
}

template <typename T, Reduction kReduction>
KernelSet kernels_of(BatchNormActivation activation) {
  switch (activation) {
    case BatchNormActivation::none: return kernels_of_reduction<T, BatchNormActivation::none, kReduction>();
    case BatchNormActivation::relu: return kernels_of_reduction<T, BatchNormActivation::relu, kReduction>();
    case BatchNormActivation::add_relu: return kernels_of_reduction<T, BatchNormActivation::add_relu, kReduction>();
  }
  return {};
}

template <Reduction kReduction>
KernelSet kernels_of(ElementType type, BatchNormActivation activation) {
  if (type == ElementType::float16) return kernels_of<__half, kReduction>(activation);
  if (type == ElementType::bfloat16) return kernels_of<__nv_bfloat16, kReduction>(activation);
  return {};
}

template <typename T>
const void* given_statistics_forward_of(BatchNormActivation activation) {
  switch (activation) {
    case BatchNormActivation::none:
      return reinterpret_cast<const void*>(&given_statistics_forward_kernel<T, BatchNormActivation::none>);
    case BatchNormActivation::relu:
      return reinterpret_cast<const void*>(&given_statistics_forward_kernel<T, BatchNormActivation::relu>);
    case BatchNormActivation::add_relu:
      return reinterpret_cast<const void*>(&given_statistics_forward_kernel<T, BatchNormActivation::add_relu>);
  }
  return nullptr;
}

}  // namespace

const void* given_statistics_forward_of(ElementType type, BatchNormActivation activation) {
  if (type == ElementType::float16) return given_statistics_forward_of<__half>(activation);
  if (type == ElementType::bfloat16) return given_statistics_forward_of<__nv_bfloat16>(activation);
  return nullptr;
}

KernelSet kernels_of(ElementType type, BatchNormActivation activation, Reduction reduction) {
  if (reduction == Reduction::cluster) return kernels_of<Reduction::cluster>(type, activation);
  if (reduction == Reduction::grid) return kernels_of<Reduction::grid>(type, activation);
  if (reduction == Reduction::streaming) return kernels_of<Reduction::streaming>(type, activation);
  return {};
}

}  // namespace ltrain::kernels::batch_norm_detail
