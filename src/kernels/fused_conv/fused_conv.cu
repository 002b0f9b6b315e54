// The host side of ltrain's convolution with BatchNorm statistics (kernels/fused_conv.h): which
// CUTLASS configuration runs a shape, the workspace it needs, and the kernel that adds the
// epilogue's per-tile partial rows into the per-channel sums. The CUTLASS kernels themselves are
// conv_statistics.cuh, instantiated under instances/.
#include "ltrain/kernels/fused_conv.h"

#include <cooperative_groups.h>

#include "conv_statistics.cuh"

namespace ltrain::kernels {
namespace fused_conv_detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kFinishThreads = 256;
constexpr int kFinishColumns = 64;  // a cluster's columns: 16 float4 columns of 4 channels
constexpr int kFinishVectors = kFinishColumns / 4;
constexpr int kFinishLanes = kFinishThreads / kFinishVectors;  // rows read side by side

__device__ inline void add(float4& into, const float4& value) {
  into.x += value.x;
  into.y += value.y;
  into.z += value.z;
  into.w += value.w;
}

/// sum[c] = sum over t of partial_sum[t, c] (and the same for the squares), for the 64 channels of
/// column group blockIdx.x. The cluster's blocks (blockIdx.y) take every cluster-th group of 16
/// rows; each block adds its lanes in lane order, and block 0 adds the blocks in rank order through
/// distributed shared memory: the same order on every run.
/// partial_*: [tiles, padded] float32; padded is a multiple of 64.
__global__ void __launch_bounds__(kFinishThreads) finish_statistics(const float* __restrict__ partial_sum,
                                                                    const float* __restrict__ partial_square,
                                                                    int64_t tiles, int64_t padded, int64_t channels,
                                                                    float* __restrict__ sum,
                                                                    float* __restrict__ square_sum) {
  cg::cluster_group cluster = cg::this_cluster();
  const int vector = static_cast<int>(threadIdx.x) % kFinishVectors;
  const int lane = static_cast<int>(threadIdx.x) / kFinishVectors;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kFinishColumns + vector * 4;
  const int64_t rank = cluster.block_rank(), ranks = cluster.num_blocks();

  float4 s = make_float4(0.f, 0.f, 0.f, 0.f), q = s;
#pragma unroll 8
  for (int64_t row = rank * kFinishLanes + lane; row < tiles; row += ranks * kFinishLanes) {
    add(s, __ldg(reinterpret_cast<const float4*>(partial_sum + row * padded + column)));
    add(q, __ldg(reinterpret_cast<const float4*>(partial_square + row * padded + column)));
  }

  __shared__ float4 shared_sum[kFinishThreads];
  __shared__ float4 shared_square[kFinishThreads];
  shared_sum[threadIdx.x] = s;
  shared_square[threadIdx.x] = q;
  __syncthreads();
  if (lane == 0) {
    for (int l = 1; l < kFinishLanes; ++l) {
      add(s, shared_sum[l * kFinishVectors + vector]);
      add(q, shared_square[l * kFinishVectors + vector]);
    }
  }
  __syncthreads();  // every lane's value read before lane 0 overwrites the first row
  if (lane == 0) {
    shared_sum[vector] = s;
    shared_square[vector] = q;
  }
  cluster.sync();
  if (rank == 0 && lane == 0) {
    for (int64_t r = 1; r < ranks; ++r) {
      add(s, cluster.map_shared_rank(shared_sum, static_cast<unsigned>(r))[vector]);
      add(q, cluster.map_shared_rank(shared_square, static_cast<unsigned>(r))[vector]);
    }
    const float sums[4] = {s.x, s.y, s.z, s.w}, squares[4] = {q.x, q.y, q.z, q.w};
    for (int k = 0; k < 4; ++k) {
      if (column + k < channels) {
        sum[column + k] = sums[k];
        square_sum[column + k] = squares[k];
      }
    }
  }
  cluster.sync();  // the other blocks' shared memory stays alive until block 0 has read it
}

int64_t round_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }

/// The partial rows' shape under `config`: [tiles, padded].
void partial_shape(const ConvShape& shape, FusedConvConfig config, int64_t* tiles, int64_t* padded) {
  const TileSize tile = tile_size(config);
  const int64_t rows = shape.batch * shape.out_height() * shape.out_width();
  *tiles = (rows + tile.m - 1) / tile.m;
  *padded = round_up(round_up(shape.out_channels, tile.n), kFinishColumns);
}

/// Blocks per cluster of finish_statistics for `tiles` rows: enough that each block reads at most
/// about 128 rows, at most 16 (a non-portable size, where the device allows it) else 8.
int finish_cluster_size(int64_t tiles) {
  static const bool sixteen = [] {
    return cudaFuncSetAttribute(finish_statistics, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  }();
  cudaGetLastError();
  const int limit = sixteen ? 16 : 8;
  int size = 1;
  while (size < limit && tiles > 128 * size) size *= 2;
  return size;
}

cudaError_t launch_finish(const ConvShape& shape, FusedConvConfig config, const float* partial_sum,
                          const float* partial_square, float* sum, float* square_sum, cudaStream_t stream) {
  int64_t tiles = 0, padded = 0;
  partial_shape(shape, config, &tiles, &padded);
  const int cluster = finish_cluster_size(tiles);
  cudaLaunchConfig_t launch = {};
  launch.gridDim = dim3(static_cast<unsigned>(padded / kFinishColumns), static_cast<unsigned>(cluster), 1);
  launch.blockDim = dim3(kFinishThreads, 1, 1);
  launch.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.z = 1;
  launch.attrs = &attribute;
  launch.numAttrs = 1;
  return cudaLaunchKernelEx(&launch, finish_statistics, partial_sum, partial_square, tiles, padded,
                            shape.out_channels, sum, square_sum);
}

template <ElementType type>
cudaError_t run_config(FusedConvConfig config, const ConvShape& shape, const ConvStatisticsArguments& arguments,
                       cudaStream_t stream) {
  switch (config) {
    case FusedConvConfig::conv_256x64x64:
      return run_conv_statistics<type, FusedConvConfig::conv_256x64x64>(shape, arguments, stream);
    case FusedConvConfig::conv_128x128x64:
      return run_conv_statistics<type, FusedConvConfig::conv_128x128x64>(shape, arguments, stream);
    case FusedConvConfig::gemm_256x64x64:
      return run_conv_statistics<type, FusedConvConfig::gemm_256x64x64>(shape, arguments, stream);
    case FusedConvConfig::gemm_256x128x64:
      return run_conv_statistics<type, FusedConvConfig::gemm_256x128x64>(shape, arguments, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

TileSize tile_size(FusedConvConfig config) {
  switch (config) {
    case FusedConvConfig::conv_256x64x64: return {256, 64};
    case FusedConvConfig::conv_128x128x64: return {128, 128};
    case FusedConvConfig::gemm_256x64x64: return {256, 64};
    case FusedConvConfig::gemm_256x128x64: return {256, 128};
    default: return {0, 0};
  }
}

}  // namespace fused_conv_detail

using fused_conv_detail::partial_shape;

namespace {
/// In NHWC, a 1x1 convolution of stride 1 without padding is the GEMM x[M, C] w[K, C]^T.
bool is_gemm(const ConvShape& s) { return s.kernel == 1 && s.stride == 1 && s.padding == 0; }
}  // namespace

const char* fused_conv_config_name(FusedConvConfig config) {
  switch (config) {
    case FusedConvConfig::automatic: return "automatic";
    case FusedConvConfig::conv_256x64x64: return "conv 256x64x64";
    case FusedConvConfig::conv_128x128x64: return "conv 128x128x64";
    case FusedConvConfig::gemm_256x64x64: return "gemm 256x64x64";
    case FusedConvConfig::gemm_256x128x64: return "gemm 256x128x64";
    default: return "unknown";
  }
}

FusedConvConfig fused_conv_config(ElementType, const ConvShape& shape) {
  // As measured on an H200 (docs/BENCHMARKS.md): the persistent GEMM's 256x64 tile beats its
  // 256x128 one on every 1x1 layer of ResNet-50 (the 128-wide epilogue keeps its sums in local
  // memory); the implicit GEMM's 256x64 tile suits 64 output channels, its 128x128 one the rest.
  if (is_gemm(shape)) return FusedConvConfig::gemm_256x64x64;
  return shape.out_channels <= 64 ? FusedConvConfig::conv_256x64x64 : FusedConvConfig::conv_128x128x64;
}

bool fused_conv_pays(ElementType type, const ConvShape& shape) {
  constexpr int64_t kSmallestPayingMap = 32 * 32;
  return fused_conv_supported(type, shape, nullptr) && is_gemm(shape) &&
         shape.out_height() * shape.out_width() >= kSmallestPayingMap;
}

bool fused_conv_supported(ElementType type, const ConvShape& s, const char** why_not) {
  const char* why = nullptr;
  if (type != ElementType::float16 && type != ElementType::bfloat16) why = "the element type is not fp16 or bf16";
  else if (s.batch < 1 || s.height < 1 || s.width < 1) why = "an empty input";
  else if (s.in_channels < 8 || s.in_channels % 8 != 0 || s.out_channels < 8 || s.out_channels % 8 != 0)
    why = "channels are not positive multiples of 8 (16-byte rows for TMA)";
  else if (s.kernel < 1 || s.kernel > 7 || s.stride < 1 || s.stride > 8 || s.padding < 0 || s.padding >= s.kernel)
    why = "kernel 1..7, stride 1..8 and padding below the kernel are what the im2col loads take";
  else if (s.out_height() < 1 || s.out_width() < 1) why = "an empty output";
  else if (s.batch * s.height * s.width * s.in_channels >= (int64_t{1} << 31) ||
           s.batch * s.out_height() * s.out_width() * s.out_channels >= (int64_t{1} << 31))
    why = "a tensor of 2^31 elements or more (32-bit im2col coordinates)";
  if (why_not != nullptr) *why_not = why;
  return why == nullptr;
}

bool fused_conv_device_supported(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;  // sm_90a code runs on compute capability 9.0 alone
}

size_t fused_conv_workspace_bytes(ElementType type, const ConvShape& shape, FusedConvConfig config) {
  if (config == FusedConvConfig::automatic) config = fused_conv_config(type, shape);
  int64_t tiles = 0, padded = 0;
  partial_shape(shape, config, &tiles, &padded);
  return 2 * static_cast<size_t>(tiles * padded) * sizeof(float);
}

cudaError_t fused_conv_forward(ElementType type, const ConvShape& shape, const FusedConvForward& a,
                               cudaStream_t stream, FusedConvConfig config) {
  if (!fused_conv_supported(type, shape, nullptr)) return cudaErrorNotSupported;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !fused_conv_device_supported(device)) return cudaErrorNotSupported;
  if (config == FusedConvConfig::automatic) config = fused_conv_config(type, shape);
  if (static_cast<int>(config) < 0 || config >= FusedConvConfig::count) return cudaErrorInvalidValue;
  const size_t bytes = fused_conv_workspace_bytes(type, shape, config);
  if (a.workspace == nullptr || a.workspace_bytes < bytes) return cudaErrorInvalidValue;

  float* partial_sum = static_cast<float*>(a.workspace);
  float* partial_square = partial_sum + bytes / sizeof(float) / 2;
  const fused_conv_detail::ConvStatisticsArguments arguments{a.x, a.weight, a.y, partial_sum, partial_square};
  const cudaError_t conv = type == ElementType::bfloat16
                               ? fused_conv_detail::run_config<ElementType::bfloat16>(config, shape, arguments, stream)
                               : fused_conv_detail::run_config<ElementType::float16>(config, shape, arguments, stream);
  if (conv != cudaSuccess) return conv;
  return fused_conv_detail::launch_finish(shape, config, partial_sum, partial_square, a.sum, a.square_sum, stream);
}

}  // namespace ltrain::kernels
