#include "ltrain/kernels/cross_entropy.h"

#include <algorithm>

#include "element_access.cuh"
#include "ltrain/kernels/device_limits.h"

namespace ltrain::kernels {
namespace {

// One block takes every row, a thread a row at a time: a step's 256-1024 rows of 10 or 100 logits
// are a few kilobytes, and one block sums their losses in a fixed order without a second launch.
constexpr int kForwardThreads = 1024;  // a power of two: the block's sum halves it
constexpr int kBackwardThreads = 256;
constexpr int64_t kBackwardMostBlocks = 4096;  // the loop strides over the rest

template <typename T>
__global__ void __launch_bounds__(kForwardThreads)
    forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ labels, int64_t rows, int32_t classes,
                   float smoothing, float* __restrict__ loss, float* __restrict__ gradient) {
  __shared__ float row_losses[kForwardThreads];
  const float on_label = 1.0f - smoothing;
  const float off_label = smoothing / static_cast<float>(classes);
  const float rows_float = static_cast<float>(rows);
  float thread_loss = 0.0f;
  for (int64_t row = threadIdx.x; row < rows; row += kForwardThreads) {
    const T* x = logits + row * classes;
    float* g = gradient + row * classes;
    const int64_t label = labels[row];
    const bool label_valid = label >= 0 && label < classes;
    // z = x - max(x), as log-softmax shifts it; S = sum exp(z), log softmax = z - log S.
    float max_x = to_float(x[0]);
    for (int32_t j = 1; j < classes; ++j) max_x = fmaxf(max_x, to_float(x[j]));
    float exp_sum = 0.0f, z_sum = 0.0f;
    for (int32_t j = 0; j < classes; ++j) {
      const float z = to_float(x[j]) - max_x;
      exp_sum += expf(z);
      z_sum += z;
    }
    const float log_sum = logf(exp_sum);
    const float z_label = label_valid ? to_float(x[label]) - max_x : __int_as_float(0x7fc00000);  // NaN
    // -log softmax[label] = log S - z[label]; sum_j -log softmax[j] = classes * log S - sum_j z[j].
    float row_loss = on_label * (log_sum - z_label);
    if (smoothing > 0.0f) row_loss += off_label * (static_cast<float>(classes) * log_sum - z_sum);
    thread_loss += row_loss;
    for (int32_t j = 0; j < classes; ++j) {
      const float target = (j == label ? on_label : 0.0f) + off_label;
      const float probability = expf(to_float(x[j]) - max_x - log_sum);
      g[j] = label_valid ? (probability - target) / rows_float : z_label;
    }
  }
  row_losses[threadIdx.x] = thread_loss;
  __syncthreads();
  for (int half = kForwardThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) row_losses[threadIdx.x] += row_losses[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = row_losses[0] / rows_float;
}

template <typename T>
__global__ void __launch_bounds__(kBackwardThreads)
    backward_kernel(const float* __restrict__ gradient, const float* __restrict__ grad_loss, T* __restrict__ grad_logits,
                    int64_t count) {
  const float scale = grad_loss[0];
  for (int64_t i = first_thread(); i < count; i += thread_stride()) grad_logits[i] = from_float<T>(gradient[i] * scale);
}

template <typename T>
cudaError_t launch_forward(const void* logits, const int64_t* labels, const CrossEntropyShape& shape, float smoothing,
                           float* loss, float* gradient, cudaStream_t stream) {
  forward_kernel<T><<<1, kForwardThreads, 0, stream>>>(static_cast<const T*>(logits), labels, shape.rows,
                                                       static_cast<int32_t>(shape.classes), smoothing, loss, gradient);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const float* gradient, const float* grad_loss, void* grad_logits, int64_t count,
                            cudaStream_t stream) {
  const int64_t blocks = std::min((count + kBackwardThreads - 1) / kBackwardThreads, kBackwardMostBlocks);
  backward_kernel<T><<<static_cast<unsigned>(blocks), kBackwardThreads, 0, stream>>>(
      gradient, grad_loss, static_cast<T*>(grad_logits), count);
  return cudaGetLastError();
}

}  // namespace

KernelFit cross_entropy_fit() {
  const KernelFit forward =
      fit_on_current_device({reinterpret_cast<const void*>(&forward_kernel<__half>)}, kForwardThreads, Cooperation::none);
  if (!forward.runs) return forward;
  return fit_on_current_device({reinterpret_cast<const void*>(&backward_kernel<__half>)}, kBackwardThreads,
                               Cooperation::none);
}

cudaError_t cross_entropy_forward(ElementType type, const void* logits, const int64_t* labels,
                                  const CrossEntropyShape& shape, float smoothing, float* loss, float* gradient,
                                  cudaStream_t stream) {
  if (shape.rows < 1 || shape.rows > kCrossEntropyMostRows || shape.classes < 1 ||
      shape.classes > kCrossEntropyMostClasses)
    return cudaErrorInvalidValue;
  return with_element_type(type, [&](auto element) {
    return launch_forward<decltype(element)>(logits, labels, shape, smoothing, loss, gradient, stream);
  });
}

cudaError_t cross_entropy_backward(ElementType type, const float* gradient, const float* grad_loss,
                                   void* grad_logits, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return with_element_type(type, [&](auto element) {
    return launch_backward<decltype(element)>(gradient, grad_loss, grad_logits, count, stream);
  });
}

}  // namespace ltrain::kernels
