#pragma once
// ltrain's own forward convolution with the next BatchNorm's statistics fused in: y = conv(x, w)
// stored in the tensors' type, and the per-output-channel sum and sum of squares of y in float32
// (taken from the float32 accumulators, before y is rounded), so that BatchNorm needs no pass of
// its own to read y for its statistics.
//
// The convolution is CUTLASS's Hopper implicit GEMM (TMA im2col loads, wgmma; sm_90a only):
// GEMM M = batch * out_height * out_width rows, N = out_channels, K = in_channels * kernel^2; a
// 1x1 convolution of stride 1 is a plain GEMM in NHWC, and runs on CUTLASS's persistent GEMM.
// Its epilogue is a visitor tree that stores y and reduces y and y^2 over each M tile into one
// float32 partial row per tile ([tiles_m, out_channels], no atomics); a second small kernel adds
// those rows in a fixed order (thread-block clusters, no zeroed memory, bitwise deterministic).
//
// Plain CUDA (no LibTorch headers), built only with -DLTRAIN_FUSED_CONV=ON for sm_90a; tensors are
// NHWC (channels_last), weights KRSC, fully packed, 16-byte aligned.
// scripts/kernels/bench_fused_conv.cu times it against cuDNN per layer (docs/BENCHMARKS.md).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ltrain/kernels/conv_shape.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// The compiled CUTLASS configurations (kernel, tile M x N x K, pipeline stages), one kernel each per
/// element type. fused_conv_config picks one per shape; benchmarks may name one.
enum class FusedConvConfig : int {
  automatic = -1,
  conv_256x64x64 = 0,   ///< implicit GEMM, 2 stages: any convolution, narrow outputs (64 channels)
  conv_128x128x64 = 1,  ///< implicit GEMM, 3 stages: any convolution
  gemm_256x64x64 = 2,   ///< persistent GEMM, 4 stages: 1x1, stride 1, 64 output channels
  gemm_256x128x64 = 3,  ///< persistent GEMM, 3 stages: 1x1, stride 1 (slower than 256x64 on ResNet-50)
  count = 4,
};

/// "128x128x64, 3 stages": for logs and benchmarks.
const char* fused_conv_config_name(FusedConvConfig config);

/// The configuration fused_conv_forward runs for `shape` under `automatic`.
FusedConvConfig fused_conv_config(ElementType type, const ConvShape& shape);

/// Whether a training step gains by running this convolution here rather than on cuDNN, where the
/// BatchNorm after it then takes the statistics from the sums instead of reading y for them
/// (kernels/batch_norm.h's batch_norm_forward_given_statistics). From the per-layer times of both
/// pairs on an H200 (docs/BENCHMARKS.md): 1x1 convolutions of stride 1 with outputs of 32x32 or
/// more, where the read of y the BatchNorm saves outweighs what this kernel costs over cuDNN's.
bool fused_conv_pays(ElementType type, const ConvShape& shape);

/// Whether the kernels take this type and shape at all (pure: no device is asked): fp16 or bf16,
/// channels multiples of 8 (16-byte TMA rows), kernel 1..7, stride 1..8, padding < kernel, and
/// index ranges that fit CUTLASS's 32-bit im2col coordinates. Else *why_not says why.
bool fused_conv_supported(ElementType type, const ConvShape& shape, const char** why_not);

/// Whether this device runs them: an sm_90 GPU (the kernels are built for sm_90a alone).
bool fused_conv_device_supported(int device);

/// Bytes of device workspace one call needs for `shape` under `config` (the per-tile partial rows).
size_t fused_conv_workspace_bytes(ElementType type, const ConvShape& shape,
                                  FusedConvConfig config = FusedConvConfig::automatic);

struct FusedConvForward {
  const void* x = nullptr;       ///< [batch, height, width, in_channels]
  const void* weight = nullptr;  ///< [out_channels, kernel, kernel, in_channels]
  void* y = nullptr;             ///< written: [batch, out_height, out_width, out_channels]
  float* sum = nullptr;          ///< written: [out_channels], sum of y over batch and space
  float* square_sum = nullptr;   ///< written: [out_channels], sum of y^2
  void* workspace = nullptr;     ///< fused_conv_workspace_bytes(), 16-byte aligned; no zeroing needed
  size_t workspace_bytes = 0;
};

/// Enqueues the convolution and its statistics on `stream` (two kernels; capturable in a CUDA
/// graph). Returns cudaErrorNotSupported for what fused_conv_supported refuses or the device cannot
/// run, cudaErrorInvalidValue for a short workspace, else the launch error.
cudaError_t fused_conv_forward(ElementType type, const ConvShape& shape, const FusedConvForward& arguments,
                               cudaStream_t stream, FusedConvConfig config = FusedConvConfig::automatic);

}  // namespace ltrain::kernels
