#include "ltrain/kernels/max_pool.h"

#include <algorithm>
#include <limits>

#include "element_access.cuh"
#include "ltrain/kernels/device_limits.h"

namespace ltrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the loops stride over the rest
constexpr int kVectorBytes = 16;

/// The channels one thread handles: one 16-byte load or store of T, and their arg-max bytes.
template <typename T>
struct alignas(kVectorBytes) Lanes {
  static constexpr int kCount = kVectorBytes / static_cast<int>(sizeof(T));
  T value[kCount];
};
template <int Count>
struct alignas(Count) PositionLanes {
  uint8_t value[Count];
};

/// PoolGeometry in the kernels' index type: 32-bit where every index fits, since the divisions
/// that split a vector's index into n, h, w and channel group cost several times more in 64 bits
/// (measured on the backward: docs/BENCHMARKS.md).
template <typename Index>
struct Geometry {
  Index batch, height, width, channels, out_height, out_width, kernel, stride, padding;
  explicit Geometry(const PoolGeometry& g)
      : batch(static_cast<Index>(g.batch)),
        height(static_cast<Index>(g.height)),
        width(static_cast<Index>(g.width)),
        channels(static_cast<Index>(g.channels)),
        out_height(static_cast<Index>(g.out_height)),
        out_width(static_cast<Index>(g.out_width)),
        kernel(static_cast<Index>(g.kernel)),
        stride(static_cast<Index>(g.stride)),
        padding(static_cast<Index>(g.padding)) {}
};

/// Where vector i of a [batch, height, width, groups] tensor lies:
/// i = ((n * height + h) * width + w) * groups + group.
template <typename Index>
struct VectorPlace {
  Index n, h, w, group;
};
template <typename Index>
__device__ VectorPlace<Index> vector_place(Index i, Index height, Index width, Index groups) {
  VectorPlace<Index> place;
  place.group = i % groups;
  Index rest = i / groups;
  place.w = rest % width;
  rest /= width;
  place.h = rest % height;
  place.n = rest / height;
  return place;
}

template <typename T, typename Index>
__global__ void forward_kernel(const Lanes<T>* __restrict__ input, Lanes<T>* __restrict__ output,
                               PositionLanes<Lanes<T>::kCount>* __restrict__ argmax, Geometry<Index> g) {
  constexpr int kCount = Lanes<T>::kCount;
  const Index groups = g.channels / kCount;
  const Index total = g.batch * g.out_height * g.out_width * groups;
  // Output vectors in memory order.
  for (Index i = static_cast<Index>(first_thread()); i < total; i += static_cast<Index>(thread_stride())) {
    const auto [n, oh, ow, group] = vector_place(i, g.out_height, g.out_width, groups);
    const Index top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
    // ATen starts from -inf at the window's first element inside the image.
    const auto first = static_cast<uint8_t>((top < 0 ? -top : 0) * g.kernel + (left < 0 ? -left : 0));
    float best[kCount];
    T best_value[kCount];
    uint8_t position[kCount];
    for (int lane = 0; lane < kCount; ++lane) {
      best[lane] = -__int_as_float(0x7f800000);  // -inf
      best_value[lane] = from_float<T>(best[lane]);
      position[lane] = first;
    }
    for (Index kh = 0; kh < g.kernel; ++kh) {
      const Index h = top + kh;
      if (h < 0 || h >= g.height) continue;
      for (Index kw = 0; kw < g.kernel; ++kw) {
        const Index w = left + kw;
        if (w < 0 || w >= g.width) continue;
        const Lanes<T> values = input[((n * g.height + h) * g.width + w) * groups + group];
        for (int lane = 0; lane < kCount; ++lane) {
          const float value = to_float(values.value[lane]);
          if (value > best[lane] || isnan(value)) {
            best[lane] = value;
            best_value[lane] = values.value[lane];
            position[lane] = static_cast<uint8_t>(kh * g.kernel + kw);
          }
        }
      }
    }
    Lanes<T> out;
    PositionLanes<kCount> where;
    for (int lane = 0; lane < kCount; ++lane) {
      out.value[lane] = best_value[lane];
      where.value[lane] = position[lane];
    }
    output[i] = out;
    argmax[i] = where;
  }
}

template <typename T, typename Index>
__global__ void backward_kernel(const Lanes<T>* __restrict__ grad_output,
                                const PositionLanes<Lanes<T>::kCount>* __restrict__ argmax,
                                Lanes<T>* __restrict__ grad_input, Geometry<Index> g) {
  constexpr int kCount = Lanes<T>::kCount;
  const Index groups = g.channels / kCount;
  const Index total = g.batch * g.height * g.width * groups;
  for (Index i = static_cast<Index>(first_thread()); i < total; i += static_cast<Index>(thread_stride())) {
    const auto [n, h, w, group] = vector_place(i, g.height, g.width, groups);
    // The windows that hold row h: oh * stride - padding <= h <= oh * stride - padding + kernel - 1.
    const Index oh_begin = h + g.padding < g.kernel ? 0 : (h + g.padding - g.kernel) / g.stride + 1;
    const Index oh_end = min((h + g.padding) / g.stride + 1, g.out_height);
    const Index ow_begin = w + g.padding < g.kernel ? 0 : (w + g.padding - g.kernel) / g.stride + 1;
    const Index ow_end = min((w + g.padding) / g.stride + 1, g.out_width);
    float sum[kCount] = {};
    for (Index oh = oh_begin; oh < oh_end; ++oh) {
      for (Index ow = ow_begin; ow < ow_end; ++ow) {
        const auto here = static_cast<uint8_t>((h - (oh * g.stride - g.padding)) * g.kernel +
                                               (w - (ow * g.stride - g.padding)));
        const Index o = ((n * g.out_height + oh) * g.out_width + ow) * groups + group;
        const PositionLanes<kCount> where = argmax[o];
        bool any = false;
        for (int lane = 0; lane < kCount; ++lane) any |= where.value[lane] == here;
        if (!any) continue;  // most windows pick another element: skip the gradient's load
        const Lanes<T> grads = grad_output[o];
        for (int lane = 0; lane < kCount; ++lane)
          if (where.value[lane] == here) sum[lane] += to_float(grads.value[lane]);
      }
    }
    Lanes<T> out;
    for (int lane = 0; lane < kCount; ++lane) out.value[lane] = from_float<T>(sum[lane]);
    grad_input[i] = out;
  }
}

int blocks_for(int64_t threads) {
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/// Whether 32-bit indices reach every input and output vector, and the grid-stride loop's step
/// past the last of them (which must not overflow either).
bool fits_int32(const PoolGeometry& g, int64_t vector_width) {
  const int64_t positions = std::max(g.height * g.width, g.out_height * g.out_width);
  const int64_t largest = positions * g.batch * (g.channels / vector_width);
  return largest + kMaxBlocks * kThreads <= std::numeric_limits<int32_t>::max();
}

template <typename T>
cudaError_t launch_forward(const void* input, void* output, uint8_t* argmax, const PoolGeometry& g,
                           cudaStream_t stream) {
  constexpr int kCount = Lanes<T>::kCount;
  const int64_t vectors = g.batch * g.out_height * g.out_width * (g.channels / kCount);
  if (vectors == 0) return cudaSuccess;
  auto launch = [&](auto geometry) {
    using Index = decltype(geometry.batch);
    forward_kernel<T, Index><<<blocks_for(vectors), kThreads, 0, stream>>>(
        static_cast<const Lanes<T>*>(input), static_cast<Lanes<T>*>(output),
        reinterpret_cast<PositionLanes<kCount>*>(argmax), geometry);
  };
  if (fits_int32(g, kCount)) launch(Geometry<int32_t>(g));
  else launch(Geometry<int64_t>(g));
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const void* grad_output, const uint8_t* argmax, void* grad_input,
                            const PoolGeometry& g, cudaStream_t stream) {
  constexpr int kCount = Lanes<T>::kCount;
  const int64_t vectors = g.batch * g.height * g.width * (g.channels / kCount);
  if (vectors == 0) return cudaSuccess;
  auto launch = [&](auto geometry) {
    using Index = decltype(geometry.batch);
    backward_kernel<T, Index><<<blocks_for(vectors), kThreads, 0, stream>>>(
        static_cast<const Lanes<T>*>(grad_output), reinterpret_cast<const PositionLanes<kCount>*>(argmax),
        static_cast<Lanes<T>*>(grad_input), geometry);
  };
  if (fits_int32(g, kCount)) launch(Geometry<int32_t>(g));
  else launch(Geometry<int64_t>(g));
  return cudaGetLastError();
}

}  // namespace

int64_t max_pool_vector_width(ElementType type) { return type == ElementType::float32 ? 4 : 8; }

KernelFit max_pool_fit() {
  return fit_on_current_device({reinterpret_cast<const void*>(&forward_kernel<__half, int32_t>),
                                reinterpret_cast<const void*>(&backward_kernel<__half, int32_t>)},
                               kThreads, Cooperation::none);
}

cudaError_t max_pool_forward(ElementType type, const void* input, void* output, uint8_t* argmax,
                                  const PoolGeometry& geometry, cudaStream_t stream) {
  return with_element_type(type, [&](auto element) {
    return launch_forward<decltype(element)>(input, output, argmax, geometry, stream);
  });
}

cudaError_t max_pool_backward(ElementType type, const void* grad_output, const uint8_t* argmax,
                                   void* grad_input, const PoolGeometry& geometry, cudaStream_t stream) {
  return with_element_type(type, [&](auto element) {
    return launch_backward<decltype(element)>(grad_output, argmax, grad_input, geometry, stream);
  });
}

}  // namespace ltrain::kernels
