#include "ltrain/kernels/gradient_kernels.h"

#include <climits>

#include "element_access.cuh"
#include "ltrain/kernels/device_limits.h"

namespace ltrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // independent loads in flight per thread
constexpr int64_t kChunk = int64_t{kThreads} * kPerThread;  // elements per block of the SGD kernel
// The inf/NaN check loads 16 bytes at a time, over blocks of 8x the SGD kernel's elements (8
// loads a thread of fp16/bf16, 16 of float32): scalar loads over small blocks fell well short of
// the memory's bandwidth (measured: docs/BENCHMARKS.md).
constexpr int kCheckVectorBytes = 16;
constexpr int64_t kCheckChunk = kChunk * 8;  // elements per block of the inf/NaN check

/// What one launch covers: up to Capacity tensors, cut into chunks of kChunk elements, one block
/// per chunk. It travels as a kernel argument, so a captured graph keeps its own copy.
template <typename Entry, int Capacity>
struct Batch {
  Entry entries[Capacity];
  int32_t first_chunk[Capacity + 1];  // entry e's chunks are blocks first_chunk[e] .. first_chunk[e + 1] - 1
  int32_t count;
};
using CheckBatch = Batch<GradientView, 128>;
using SgdBatch = Batch<SgdParameter, 64>;
// CUDA's portable limit for a kernel's arguments is 4 KB.
static_assert(sizeof(CheckBatch) + sizeof(float*) <= 4096, "CheckBatch outgrows the kernel argument space");
static_assert(sizeof(SgdBatch) + sizeof(SgdSettings) <= 4096, "SgdBatch outgrows the kernel argument space");

int64_t element_count(const GradientView& gradient) { return gradient.count; }
int64_t element_count(const SgdParameter& parameter) { return parameter.gradient.count; }

/// The entry whose chunks hold this block: the last e with first_chunk[e] <= blockIdx.x.
template <typename B>
__device__ int entry_of_block(const B& batch) {
  int low = 0, high = batch.count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (batch.first_chunk[middle] <= static_cast<int32_t>(blockIdx.x)) low = middle;
    else high = middle - 1;
  }
  return low;
}

/// This block's element range [begin, end) of entry e, cut in chunks of `chunk` elements.
struct Range {
  int64_t begin, end;
};
template <typename B>
__device__ Range range_of_block(const B& batch, int entry, int64_t count, int64_t chunk) {
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - batch.first_chunk[entry]) * chunk;
  return {begin, min(begin + chunk, count)};
}

template <typename T>
__device__ bool has_non_finite(const void* data, Range range) {
  constexpr int kLanes = kCheckVectorBytes / static_cast<int>(sizeof(T));
  struct alignas(kCheckVectorBytes) Vector {
    T lanes[kLanes];
  };
  const T* values = static_cast<const T*>(data);
  bool found = false;
  // Whole vectors where the data is aligned (range.begin is a multiple of kCheckChunk), then
  // the elements past the last whole vector one at a time.
  int64_t scalar_begin = range.begin;
  if (reinterpret_cast<uintptr_t>(values) % kCheckVectorBytes == 0) {
    const Vector* vectors = reinterpret_cast<const Vector*>(values + range.begin);
    const int64_t count = (range.end - range.begin) / kLanes;
#pragma unroll 8
    for (int64_t v = threadIdx.x; v < count; v += kThreads) {
      const Vector vector = vectors[v];
#pragma unroll
      for (int lane = 0; lane < kLanes; ++lane) found |= !isfinite(to_float(vector.lanes[lane]));
    }
    scalar_begin += count * kLanes;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < range.end; i += kThreads) found |= !isfinite(to_float(values[i]));
  return found;
}

__global__ void find_inf_kernel(CheckBatch batch, float* found_inf) {
  const int entry = entry_of_block(batch);
  const GradientView gradient = batch.entries[entry];
  const Range range = range_of_block(batch, entry, gradient.count, kCheckChunk);
  bool found = false;
  switch (gradient.type) {
    case ElementType::float32: found = has_non_finite<float>(gradient.data, range); break;
    case ElementType::float16: found = has_non_finite<__half>(gradient.data, range); break;
    case ElementType::bfloat16: found = has_non_finite<__nv_bfloat16>(gradient.data, range); break;
  }
  // One store per block that saw one; every writer stores the same 1.
  if (__syncthreads_or(found) && threadIdx.x == 0) *found_inf = 1.0f;
}

/// copy[i] = value rounded to `type` (float16 or bfloat16; the host checks).
__device__ inline void store_low_precision(void* copy, ElementType type, int64_t i, float value) {
  if (type == ElementType::bfloat16) static_cast<__nv_bfloat16*>(copy)[i] = from_float<__nv_bfloat16>(value);
  else static_cast<__half*>(copy)[i] = from_float<__half>(value);
}

// The SGD kernel moves each element's bytes in vectors of 4 elements: a thread's 8 elements are
// 2 groups of 4 consecutive ones, kThreads * 4 elements apart, so that each load or store of a
// warp covers one contiguous stretch (512 bytes of float32, 256 of fp16/bf16). Scalar accesses
// where a pointer is not aligned to its vector, or a group runs past the range's end.
constexpr int kGroupSize = 4;
constexpr int kGroups = kPerThread / kGroupSize;
static_assert(kPerThread % kGroupSize == 0, "a thread's elements are whole groups");

template <typename T>
struct alignas(kGroupSize * sizeof(T)) Group {
  T lanes[kGroupSize];
};

template <typename T>
__device__ bool group_aligned(const void* data) {
  return reinterpret_cast<uintptr_t>(data) % sizeof(Group<T>) == 0;
}

/// Element k (0 .. kPerThread - 1) of this thread in a block's range.
__device__ inline int64_t element_of_thread(Range range, int k) {
  return range.begin + int64_t{k / kGroupSize} * (kThreads * kGroupSize) + int64_t{threadIdx.x} * kGroupSize +
         k % kGroupSize;
}

/// One element's update, the same arithmetic whichever way its bytes travel.
__device__ inline void sgd_element(const SgdParameter& parameter, const SgdSettings& settings, float learning_rate,
                                   float gradient_scale, bool has_buffer, float gradient, float& value,
                                   float& buffer) {
  float direction = settings.gradient_scale ? gradient / gradient_scale : gradient;
  if (parameter.weight_decay != 0.0f) direction += parameter.weight_decay * value;
  if (has_buffer) {
    buffer = settings.momentum * buffer + direction;
    direction = settings.nesterov ? direction + settings.momentum * buffer : buffer;
  }
  value = value - learning_rate * direction;
}

template <typename C>
__device__ void store_copy_group(void* copy, int64_t first, const float* values) {
  Group<C> group;
#pragma unroll
  for (int lane = 0; lane < kGroupSize; ++lane) group.lanes[lane] = from_float<C>(values[lane]);
  *reinterpret_cast<Group<C>*>(static_cast<C*>(copy) + first) = group;
}

template <typename G>
__device__ void sgd_update(const SgdParameter& parameter, Range range, const SgdSettings& settings,
                           float learning_rate, float gradient_scale) {
  const G* gradients = static_cast<const G*>(parameter.gradient.data);
  float* const values = parameter.value;
  float* const buffers = parameter.momentum_buffer;
  void* const copy = parameter.low_precision_copy;
  const bool vectors = group_aligned<G>(gradients) && group_aligned<float>(values) &&
                       (!buffers || group_aligned<float>(buffers)) && (!copy || group_aligned<__half>(copy));
  float gradient[kPerThread] = {}, value[kPerThread] = {}, buffer[kPerThread] = {};
  bool whole[kGroups];  // the group is in range and moves as vectors
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {  // every load first, then the arithmetic and the stores
    const int64_t first = element_of_thread(range, g * kGroupSize);
    whole[g] = vectors && first + kGroupSize <= range.end;
    if (whole[g]) {
      const Group<G> gradient_group = *reinterpret_cast<const Group<G>*>(gradients + first);
      const Group<float> value_group = *reinterpret_cast<const Group<float>*>(values + first);
      const Group<float> buffer_group =
          buffers ? *reinterpret_cast<const Group<float>*>(buffers + first) : Group<float>{};
#pragma unroll
      for (int lane = 0; lane < kGroupSize; ++lane) {
        gradient[g * kGroupSize + lane] = to_float(gradient_group.lanes[lane]);
        value[g * kGroupSize + lane] = value_group.lanes[lane];
        buffer[g * kGroupSize + lane] = buffer_group.lanes[lane];
      }
      continue;
    }
#pragma unroll
    for (int lane = 0; lane < kGroupSize; ++lane) {
      const int64_t i = first + lane;
      if (i >= range.end) continue;
      gradient[g * kGroupSize + lane] = to_float(gradients[i]);
      value[g * kGroupSize + lane] = values[i];
      if (buffers) buffer[g * kGroupSize + lane] = buffers[i];
    }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    sgd_element(parameter, settings, learning_rate, gradient_scale, buffers != nullptr, gradient[k], value[k],
                buffer[k]);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int64_t first = element_of_thread(range, g * kGroupSize);
    const float* group_values = value + g * kGroupSize;
    if (whole[g]) {
      Group<float> value_group, buffer_group;
#pragma unroll
      for (int lane = 0; lane < kGroupSize; ++lane) {
        value_group.lanes[lane] = group_values[lane];
        buffer_group.lanes[lane] = buffer[g * kGroupSize + lane];
      }
      *reinterpret_cast<Group<float>*>(values + first) = value_group;
      if (buffers) *reinterpret_cast<Group<float>*>(buffers + first) = buffer_group;
      if (copy && parameter.copy_type == ElementType::bfloat16)
        store_copy_group<__nv_bfloat16>(copy, first, group_values);
      else if (copy)
        store_copy_group<__half>(copy, first, group_values);
      continue;
    }
#pragma unroll
    for (int lane = 0; lane < kGroupSize; ++lane) {
      const int64_t i = first + lane;
      if (i >= range.end) continue;
      values[i] = group_values[lane];
      if (buffers) buffers[i] = buffer[g * kGroupSize + lane];
      if (copy) store_low_precision(copy, parameter.copy_type, i, group_values[lane]);
    }
  }
}

__global__ void sgd_kernel(SgdBatch batch, SgdSettings settings) {
  if (settings.found_inf && *settings.found_inf != 0.0f) return;  // a skipped step
  const int entry = entry_of_block(batch);
  const SgdParameter parameter = batch.entries[entry];
  const Range range = range_of_block(batch, entry, parameter.gradient.count, kChunk);
  const float learning_rate = *settings.learning_rate;
  const float gradient_scale = settings.gradient_scale ? *settings.gradient_scale : 1.0f;
  switch (parameter.gradient.type) {
    case ElementType::float32: sgd_update<float>(parameter, range, settings, learning_rate, gradient_scale); break;
    case ElementType::float16: sgd_update<__half>(parameter, range, settings, learning_rate, gradient_scale); break;
    case ElementType::bfloat16:
      sgd_update<__nv_bfloat16>(parameter, range, settings, learning_rate, gradient_scale);
      break;
  }
}

/// Fills batches of `entries` (empty ones left out), one block per `chunk` elements, and calls
/// launch(batch, blocks) for each.
template <typename B, typename Entry, typename Launch>
cudaError_t launch_in_batches(const Entry* entries, int64_t count, int64_t chunk, Launch launch) {
  constexpr int kCapacity = static_cast<int>(sizeof(B::entries) / sizeof(Entry));
  B batch{};
  int64_t chunks = 0;
  auto flush = [&]() -> cudaError_t {
    if (batch.count == 0) return cudaSuccess;
    batch.first_chunk[batch.count] = static_cast<int32_t>(chunks);
    launch(batch, static_cast<unsigned>(chunks));
    batch.count = 0;
    chunks = 0;
    return cudaGetLastError();
  };
  for (int64_t i = 0; i < count; ++i) {
    const int64_t needed = (element_count(entries[i]) + chunk - 1) / chunk;
    if (needed == 0) continue;
    if (needed > INT_MAX) return cudaErrorInvalidValue;  // over 2^31 chunks: 4e12 elements
    if (batch.count == kCapacity || chunks + needed > INT_MAX) {
      if (const cudaError_t error = flush(); error != cudaSuccess) return error;
    }
    batch.entries[batch.count] = entries[i];
    batch.first_chunk[batch.count] = static_cast<int32_t>(chunks);
    ++batch.count;
    chunks += needed;
  }
  return flush();
}

__global__ void update_scaler_kernel(ScalerCounters counters, double growth_factor, double backoff_factor,
                                     int32_t growth_interval) {
  const float found_inf = *counters.found_inf;
  const int64_t skipped = static_cast<int64_t>(found_inf);  // as found_inf.to(int64): 0 or 1
  *counters.skipped_steps += skipped;
  *counters.consecutive_skips = (*counters.consecutive_skips + skipped) * skipped;
  if (found_inf != 0.0f) {
    *counters.scale = static_cast<float>(*counters.scale * backoff_factor);
    *counters.growth_tracker = 0;
    return;
  }
  const int32_t clean_steps = *counters.growth_tracker + 1;
  if (clean_steps != growth_interval) {
    *counters.growth_tracker = clean_steps;
    return;
  }
  const float grown = static_cast<float>(*counters.scale * growth_factor);
  if (isfinite(grown)) *counters.scale = grown;
  *counters.growth_tracker = 0;
}

}  // namespace

KernelFit gradient_kernels_fit() {
  return fit_on_current_device({reinterpret_cast<const void*>(&find_inf_kernel),
                                reinterpret_cast<const void*>(&sgd_kernel),
                                reinterpret_cast<const void*>(&update_scaler_kernel)},
                               kThreads, Cooperation::none);
}

cudaError_t update_scaler(const ScalerCounters& counters, double growth_factor, double backoff_factor,
                          int32_t growth_interval, cudaStream_t stream) {
  update_scaler_kernel<<<1, 1, 0, stream>>>(counters, growth_factor, backoff_factor, growth_interval);
  return cudaGetLastError();
}

cudaError_t find_inf(const GradientView* gradients, int64_t count, float* found_inf,
                            cudaStream_t stream) {
  return launch_in_batches<CheckBatch>(gradients, count, kCheckChunk, [&](const CheckBatch& batch, unsigned blocks) {
    find_inf_kernel<<<blocks, kThreads, 0, stream>>>(batch, found_inf);
  });
}

cudaError_t sgd_step(const SgdParameter* parameters, int64_t count, const SgdSettings& settings,
                     cudaStream_t stream) {
  return launch_in_batches<SgdBatch>(parameters, count, kChunk, [&](const SgdBatch& batch, unsigned blocks) {
    sgd_kernel<<<blocks, kThreads, 0, stream>>>(batch, settings);
  });
}

}  // namespace ltrain::kernels
