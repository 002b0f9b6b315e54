// SGD with momentum over all of a model's parameters in a few launches, each parameter's gradient
// read in the precision the backward pass produced it (float32, or the fp16/bf16 gradient of an
// autocast weight), and the GradScaler's inf/NaN check over the same gradients, read-only.
//
// Why: in a graphed fp16 ResNet-50 step the optimizer's tail was three passes over the gradients
// (measured: docs/BENCHMARKS.md): a copy of every fp16 weight gradient into a float32 one, ATen's
// inf check, which also writes every gradient back multiplied by 1, and ATen's fused SGD, which
// needs all its lists in one dtype. Here the check only reads, and the step
// reads the fp16 gradients where they are, so neither the copy nor the write-back happens.
//
// Plain CUDA (no LibTorch headers); ops/gradient_kernels.cpp wraps them for torch tensors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ltrain/kernels/device_fit.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// `count` contiguous elements of `type`.
struct GradientView {
  const void* data = nullptr;
  int64_t count = 0;
  ElementType type = ElementType::float32;
};

/// One parameter: float32 values and momentum buffer laid out like its gradient (same count, same
/// element order). `momentum_buffer` is null when the optimizer has no momentum.
/// `low_precision_copy`, when set, is the parameter's fp16/bf16 copy in the same element order
/// (autocast's weight for the next forward pass): the step writes it the updated values, rounded
/// to nearest, so that no separate cast of every weight has to follow.
struct SgdParameter {
  float* value = nullptr;
  float* momentum_buffer = nullptr;
  GradientView gradient;
  float weight_decay = 0.0f;
  ElementType copy_type = ElementType::float16;  // beside weight_decay: 56 bytes, no padding
  void* low_precision_copy = nullptr;
};

/// torch.optim.SGD's update (dampening 0, not maximizing, the buffers started at zero), with
/// the values that change each step read on the device, so a captured step replays correctly.
struct SgdSettings {
  float momentum = 0.0f;
  bool nesterov = false;
  const float* learning_rate = nullptr;     // [1] on the device
  const float* gradient_scale = nullptr;    // [1] or null: the gradients are divided by it first
  const float* found_inf = nullptr;  // [1] or null: non-zero skips the whole step
};

/// The GradScaler's state on the device, each [1].
struct ScalerCounters {
  float* scale = nullptr;
  int32_t* growth_tracker = nullptr;  // clean steps since the scale last changed
  const float* found_inf = nullptr;   // this step's: 0, or 1 after inf/NaN gradients
  int64_t* skipped_steps = nullptr;
  int64_t* consecutive_skips = nullptr;
};

/// torch.amp.GradScaler's update after a step, as ATen's _amp_update_scale_ (the products in
/// double, rounded to float32): after inf/NaN gradients the scale times backoff_factor and the
/// tracker 0; after growth_interval clean steps in a row the scale times growth_factor (where that
/// is finite) and the tracker 0; else the tracker counts the clean step. The skipped steps count
/// this step's found_inf, the consecutive skips too, back to 0 after a clean step. One thread, one
/// launch.
cudaError_t update_scaler(const ScalerCounters& counters, double growth_factor, double backoff_factor,
                          int32_t growth_interval, cudaStream_t stream);

/// Whether the kernels (the check, the step and the scaler's update) run on the current device
/// (an image for it in this build), and if not, why.
KernelFit gradient_kernels_fit();

/// Sets *found_inf to 1 when any element of any gradient is inf or NaN; otherwise leaves
/// it as it is (the caller zeroes it). Enqueued on `stream`; returns the first launch error.
cudaError_t find_inf(const GradientView* gradients, int64_t count, float* found_inf,
                            cudaStream_t stream);

/// For every parameter p with gradient g (float32 arithmetic):
///   g = g / gradient_scale;  g += weight_decay * p;
///   buffer = momentum * buffer + g;  g = nesterov ? g + momentum * buffer : buffer;
///   p -= learning_rate * g;  low_precision_copy = p rounded to copy_type, where set.
/// Nothing is written, copies included, in a step that found_inf skips.
cudaError_t sgd_step(const SgdParameter* parameters, int64_t count, const SgdSettings& settings,
                     cudaStream_t stream);

}  // namespace ltrain::kernels
