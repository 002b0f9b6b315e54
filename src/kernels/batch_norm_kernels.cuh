// What the BatchNorm NHWC launcher (batch_norm.cu) and its kernels (batch_norm_kernels.cu)
// share: the block shape, the device-wide accumulators' layout, and the table of kernel addresses.
// Internal to ltrain_kernels; the public interface is ltrain/kernels/batch_norm.h.
#pragma once

#include <cstdint>

#include "ltrain/kernels/batch_norm.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels::batch_norm_detail {

using Reduction = BatchNormReduction;

constexpr int kThreads = 256;
constexpr int kVector = 8;          // fp16/bf16 elements per 16-byte load
constexpr int kGroupChannels = 64;  // channels per block: 8 threads across, 32 rows down
constexpr int64_t kMaxChannels = 2048;
// Rows a thread keeps in registers from the first pass to the second: a tensor is taken only if
// the grid, all of it resident at once, covers it with this many rows per thread.
constexpr int kRowsPerThread = 8;

/// The channels one block covers: kGroupChannels, or all of them when there are fewer.
__host__ __device__ inline int group_channels_of(int64_t channels) {
  return static_cast<int>(channels < kGroupChannels ? channels : kGroupChannels);
}

/// The per-device state the kernels share: two sets of per-channel sums and which one the next
/// launch adds into. A launch adds into sums[parity], zeroes the other set for the launch after
/// it, and flips the parity once every block has read it: no memset between launches. Launches on
/// one device must run one at a time (ltrain trains each device from one stream).
struct Accumulators {
  float sums[2][2 * kMaxChannels];
  unsigned int parity;
};

/// The kernels of one element type, activation and reduction: forward, backward, and for add_relu
/// the backward that adds a second gradient.
struct KernelSet {
  const void* forward = nullptr;
  const void* backward = nullptr;
  const void* backward_second = nullptr;
};

/// The __global__ functions (as addresses for cudaLaunch*) for fp16 or bf16 `type`; all null for
/// other types or Reduction::none. Every kernel takes (BatchNormShape, BatchNormForward or
/// BatchNormBackward, Accumulators*), runs kThreads threads a block on a grid of (row groups,
/// channels / group_channels_of(channels)), and with Reduction::cluster needs a cluster of all of
/// a channel group's row groups.
KernelSet kernels_of(ElementType type, BatchNormActivation activation, Reduction reduction);

/// The forward kernel that takes the statistics as given sums (BatchNormForward's sum and
/// square_sum) for fp16 or bf16 `type`; null for other types. It takes (BatchNormShape,
/// BatchNormForward), runs kThreads threads a block on a grid of (any number of row groups,
/// channels / group_channels_of(channels)), with no cooperation between blocks.
const void* given_statistics_forward_of(ElementType type, BatchNormActivation activation);

}  // namespace ltrain::kernels::batch_norm_detail
