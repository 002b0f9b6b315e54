// Max pooling of NHWC (channels_last) tensors that keeps the arg-max as one byte per output
// element: its position in the window, kh * kernel + kw. ATen's channels_last kernels keep an
// int64 index per output element, and their backward took longer than any other single kernel of
// a graphed fp16 ResNet-50 step (measured: docs/BENCHMARKS.md).
// Plain CUDA (no LibTorch headers); ops/max_pool.cpp wraps it as an autograd function.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ltrain/kernels/device_fit.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// Input [batch, height, width, channels] and output [batch, out_height, out_width, channels],
/// both contiguous; floor mode, no dilation, padding <= kernel / 2, kernel * kernel <= 256.
struct PoolGeometry {
  int64_t batch = 0, height = 0, width = 0, channels = 0;
  int64_t out_height = 0, out_width = 0;
  int64_t kernel = 0, stride = 0, padding = 0;
};

/// Whether the kernels run on the current device (an image for it in this build), and if not, why.
KernelFit max_pool_fit();

/// Elements per 16-byte vector, the unit each thread moves: channels must be a multiple of it and
/// every pointer 16-byte aligned.
int64_t max_pool_vector_width(ElementType type);

/// output = the window's maximum, a NaN winning as in ATen (and the first of equal values);
/// argmax = the winner's position in its window. Enqueued on `stream`; returns the launch error.
cudaError_t max_pool_forward(ElementType type, const void* input, void* output, uint8_t* argmax,
                                  const PoolGeometry& geometry, cudaStream_t stream);

/// grad_input[n, h, w, c] = the sum, in float32 and in ATen's window order, of grad_output over
/// the windows whose arg-max is (h, w). One thread per input vector: no atomics, deterministic.
cudaError_t max_pool_backward(ElementType type, const void* grad_output, const uint8_t* argmax,
                                   void* grad_input, const PoolGeometry& geometry, cudaStream_t stream);

}  // namespace ltrain::kernels
