// Training-mode BatchNorm over NHWC (channels_last) fp16/bf16 tensors, with the ReLU, or the
// residual add and the ReLU, that follow it in a ResNet: one kernel forward and one backward.
//
// Why: in a graphed fp16 ResNet-50 step, cuDNN's fused BatchNorm sets a 4-byte counter before each
// of its kernels: a memset node per BatchNorm kernel, a large share of the step's graph nodes, each
// adding a launch gap beside its own time (measured: docs/BENCHMARKS.md). Here each
// direction is one launch that needs no zeroed memory: every thread loads its rows (at most 8)
// into registers and sums them, the blocks that share channels combine their sums, one thread a
// channel turns the channel's sums into its scale and offset (backward: its gradient's coefficients)
// and hands them to its block through shared memory, and each thread writes its rows' results from
// its registers. The blocks combine their sums in one of
// three ways (BatchNormReduction):
// - cluster: where a channel group's rows fit in one thread-block cluster of up to 4 blocks (sm_90
//   and later; ResNet-50's layer3 and layer4 at batch 256), through distributed shared memory, in
//   a fixed order: no device-wide barrier or atomics.
// - grid: otherwise, one cooperative launch whose blocks add their sums atomically into
//   per-channel accumulators and meet at one grid-wide barrier. Each launch zeroes the other of
//   two sets of accumulators for the launch after it. The sums' order varies with the blocks'
//   timing (float atomics): not bitwise deterministic.
// - streaming: tensors too large for one resident grid at 8 rows a thread (about 4M elements on an
//   H200) are read twice instead of held: the grid's reduction between a first pass that sums, last
//   row first (what the kernel before it wrote last is the likeliest in L2), and a second, first row
//   first (what the first pass read last), that writes. After add+ReLU the forward also writes the
//   ReLU's mask, one bit an element, which the backward reads instead of y (16 bits an element);
//   the backward stores g (the gradient after the activation, grad_residual's value) in the first
//   pass and reads it back in the second.
//   After a ReLU alone the streaming backward reads no y and stores no g: both passes recompute the
//   forward's y from x, which they read anyway, and the saved statistics, bit for bit, for the
//   ReLU's mask.
// Where the convolution that wrote x also summed it and its square per channel
// (kernels/fused_conv.h), batch_norm_forward_given_statistics takes the statistics from those
// sums: no reduction at all, and x is read once even where it is streamed.
//
// Plain CUDA (no LibTorch headers); ops/ltrain_batch_norm.cpp wraps them as an autograd function.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ltrain/kernels/device_fit.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// What follows the normalization: y = bn(x), relu(bn(x)) or relu(bn(x) + residual).
enum class BatchNormActivation { none, relu, add_relu };

/// x viewed as a [rows, channels] matrix: rows = batch * height * width, channels contiguous.
struct BatchNormShape {
  int64_t rows = 0;
  int64_t channels = 0;
};

/// How a launch's blocks combine their per-channel sums (see above).
enum class BatchNormReduction { none, cluster, grid, streaming };

/// Whether the kernels run on the current device at all (an image for it in this build, blocks that
/// fit, cooperative launches or clusters), and if not, why.
KernelFit batch_norm_fit();

/// Whether the cluster reduction can run on the current device (see kernels/device_fit.h's
/// cluster_fit), and if not, why.
KernelFit batch_norm_cluster_fit();

/// The reduction the kernels use for this element type, activation and shape on the current
/// device; none where they do not take it: fp16 or bf16, channels a power of two from 8 to 2048, at
/// least 2 rows, and either a cluster (sm_90 and later) that holds the rows or a cooperative grid
/// that fits on the device at once (streaming the rows where registers cannot hold them).
BatchNormReduction batch_norm_reduction(ElementType type, BatchNormActivation activation,
                                             const BatchNormShape& shape);

/// Whether the kernels take this on the current device and `stream`: a reduction other than none,
/// and for grid and streaming the device's accumulators made (on first use, which a capturing stream
/// cannot do).
/// Pointers must also be 16-byte aligned (the caller checks its tensors).
bool batch_norm_supported(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                               cudaStream_t stream);

struct BatchNormForward {
  const void* x = nullptr;         // [rows, channels]
  const void* residual = nullptr;  // [rows, channels], add_relu only
  void* y = nullptr;               // [rows, channels]
  const float* weight = nullptr;   // [channels], and so on
  const float* bias = nullptr;
  float* running_mean = nullptr;   // updated in place, torch.nn.BatchNorm2d's way (unbiased variance)
  float* running_var = nullptr;
  float* saved_mean = nullptr;     // written: the batch mean, and 1 / sqrt(biased variance + eps)
  float* saved_inv_std = nullptr;
  double momentum = 0.1;
  double eps = 1e-5;
  // batch_norm_forward_given_statistics only: the per-channel sums of x and of x^2 over the rows
  // ([channels] each), from which it takes the batch statistics instead of reading x for them.
  const float* sum = nullptr;
  const float* square_sum = nullptr;
  // add_relu where the shape's plan streams: written, batch_norm_relu_mask_bytes(...) bytes, bit k of
  // each set where y > 0; the backward's mask. Needed there, ignored elsewhere.
  uint8_t* relu_mask = nullptr;
};

struct BatchNormBackward {
  const void* x = nullptr;       // the forward's input [rows, channels]
  const void* y = nullptr;       // the forward's output, whose sign masks the ReLU; unused for none
  const void* grad_y = nullptr;  // [rows, channels]
  // [rows, channels] or null; add_relu only: a second gradient of y, added to grad_y as it is
  // loaded (rounded to the element type once, as an add kernel would): where y reaches two
  // consumers through two autograd outputs, so that no add kernel has to sum their gradients first.
  const void* grad_y_second = nullptr;
  void* grad_x = nullptr;        // written [rows, channels]
  void* grad_residual = nullptr; // written for add_relu: grad_y where y > 0
  const float* weight = nullptr;
  const float* bias = nullptr;   // relu only: with x and the saved statistics, y again (streaming)
  const float* saved_mean = nullptr;
  const float* saved_inv_std = nullptr;
  float* grad_weight = nullptr;  // written [channels]
  float* grad_bias = nullptr;
  const uint8_t* relu_mask = nullptr;  // the forward's, where it wrote one; add_relu streamed reads it, not y
};

/// How many bytes of ReLU mask the forward writes and the backward reads for this type, activation
/// and shape on the current device: rows * channels / 8 for add_relu where the plan streams, else 0
/// (the kernels that hold the rows in registers read y, as the ReLU alone recomputes it).
int64_t batch_norm_relu_mask_bytes(ElementType type, BatchNormActivation activation, const BatchNormShape& shape);

/// Enqueued on `stream`; return the launch error (cudaErrorNotSupported for what
/// batch_norm_supported refuses, cudaErrorInvalidValue without a relu_mask where one is needed).
cudaError_t batch_norm_forward(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                                    const BatchNormForward& arguments, cudaStream_t stream);
cudaError_t batch_norm_backward(ElementType type, BatchNormActivation activation, const BatchNormShape& shape,
                                     const BatchNormBackward& arguments, cudaStream_t stream);

/// Whether batch_norm_forward_given_statistics takes this type and shape: fp16 or bf16, channels
/// a power of two from 8 to 2048, at least 2 rows. It needs no reduction: no cluster, cooperative
/// launch or accumulators (batch_norm_fit covers its image).
bool batch_norm_given_statistics_supported(ElementType type, const BatchNormShape& shape);

/// The forward with the batch's statistics taken from arguments.sum and square_sum (the sums over
/// the rows of x and x^2, e.g. from the convolution that wrote x: kernels/fused_conv.h) rather
/// than from x: one pass that reads x once, no block waiting for another. It writes what
/// batch_norm_forward writes (y, the saved and the running statistics), and batch_norm_backward
/// is its backward. Enqueued on `stream`; cudaErrorNotSupported for what
/// batch_norm_given_statistics_supported refuses, cudaErrorInvalidValue without the sums or without a
/// relu_mask where one is needed.
cudaError_t batch_norm_forward_given_statistics(ElementType type, BatchNormActivation activation,
                                                const BatchNormShape& shape, const BatchNormForward& arguments,
                                                cudaStream_t stream);

/// Which of the kernels above launch as programmatic dependents of the kernel before them.
/// - none: no launch.
/// - clusters: the launches whose plan is the cluster reduction: few blocks, one an SM at most, which
///   find SMs free while that kernel's last blocks run.
/// - all: every launch, also the grid and streaming reductions' cooperative grids, whose blocks fill
///   the device and may take room from the kernel still running.
enum class BatchNormDependentLaunch { none, clusters, all };

/// Launch the kernels `which` says as programmatic dependents of the kernel before them in the
/// stream, on GPUs of sm_90 and later where this build's code for them is sm_90 or later: their
/// blocks may be placed while that kernel's last blocks still run, and wait inside for its results,
/// which hides part of the gap between the two. The same kernels on the same inputs: the same
/// numbers. Process-wide; none until set.
void set_batch_norm_dependent_launch(BatchNormDependentLaunch which);

}  // namespace ltrain::kernels
