// The convolution-with-statistics kernel as a CUTLASS composition: the Hopper implicit-GEMM
// mainloop (TMA im2col loads of x, TMA loads of w, wgmma into float32), and an epilogue visitor
// tree that stores y and reduces y and y^2 per output channel. Each configuration is instantiated
// in a file of its own under instances/ (a few minutes of nvcc each); fused_conv.cu reaches them
// through run_conv_statistics alone.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ltrain/kernels/fused_conv.h"

namespace ltrain::kernels::fused_conv_detail {

/// One call's device pointers: partial_sum and partial_square are [tiles_m, padded_channels]
/// float32 rows, one per M tile, that the epilogue writes and finish_statistics adds up.
struct ConvStatisticsArguments {
  const void* x;
  const void* weight;
  void* y;
  float* partial_sum;
  float* partial_square;
};

/// A configuration's tile sizes, as the host side plans with them.
struct TileSize {
  int m;
  int n;
};

TileSize tile_size(FusedConvConfig config);

/// Enqueues the CUTLASS kernel of `config` for `type` (float16 or bfloat16).
template <ElementType type, FusedConvConfig config>
cudaError_t run_conv_statistics(const ConvShape& shape, const ConvStatisticsArguments& arguments,
                                cudaStream_t stream);

}  // namespace ltrain::kernels::fused_conv_detail

#if defined(LTRAIN_FUSED_CONV_INSTANTIATE_CONV) || defined(LTRAIN_FUSED_CONV_INSTANTIATE_GEMM)
// Only the instances/ files see CUTLASS; a file instantiates one kind of kernel (CUTLASS's
// convolution and GEMM kernels, both specializations of GemmUniversal, are ambiguous side by side).
#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_types.h>
#ifdef LTRAIN_FUSED_CONV_INSTANTIATE_CONV
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#else
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#endif

namespace ltrain::kernels::fused_conv_detail {

/// The visitor tree's root: passes its first child's value (y) through, so that the second child
/// (the y^2 reduction) is computed for its side effect alone.
template <class T>
struct FirstOfTwo {
  CUTLASS_HOST_DEVICE T operator()(const T& first, const T&) const { return first; }
};

/// The epilogue's visitor tree over a TileShape of the GEMM: y = the accumulator in Element, and
/// per output channel (GEMM column n) the sums of y and y^2 over the tile's rows (M = batch *
/// out_height * out_width): one float32 row per M tile each, left to finish_statistics
/// (FinalReduction = false). Rows past M need no predicate (VisitCheckOOB = false): TMA fills their
/// x with zeros, so their accumulators are 0, the identity of both sums.
template <class Element, class TileShape>
struct StatisticsEpilogue {
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using ColumnSum = cutlass::epilogue::fusion::Sm90RowReduction<
      cutlass::plus, cutlass::plus, cutlass::plus, /*Stages=*/0, TileShape, float, float, kRound,
      cute::Stride<cute::_0, cute::_1, cute::_0>, /*Alignment=*/4, /*EnableNullptr=*/false,
      /*FinalReduction=*/false, /*VisitCheckOOB=*/false>;
  using Accumulator = cutlass::epilogue::fusion::Sm90AccFetch;
  using Square = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Accumulator, Accumulator>;
  using SumOfY = cutlass::epilogue::fusion::Sm90EVT<ColumnSum, Accumulator>;
  using SumOfSquares = cutlass::epilogue::fusion::Sm90EVT<ColumnSum, Square>;
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<FirstOfTwo, Element, float, kRound>, SumOfY, SumOfSquares>;

  /// Children first, then the node: {SumOfY: {acc, sum}, SumOfSquares: {square: {acc, acc, *}, sum}, root}.
  static typename Tree::Arguments arguments(float* partial_sum, float* partial_square) {
    return {{{}, {partial_sum, 0.0f, {}}}, {{{}, {}, {}}, {partial_square, 0.0f, {}}}, {}};
  }
};

/// The epilogue's subtile: CUTLASS's choice, except 64 columns rather than 32 on 128-wide tiles,
/// whose four column subtiles put the reductions' per-thread sums in local memory (720 bytes of
/// stack; two subtiles keep them in registers).
template <int TileN, int EpilogueM>
using EpilogueTile = cute::conditional_t<TileN == 128, cute::Shape<cute::Int<EpilogueM>, cute::_64>,
                                         cutlass::epilogue::collective::EpilogueTileAuto>;

/// Maps a launch's CUTLASS status onto a CUDA error.
inline cudaError_t launch_error(cutlass::Status status) {
  if (status == cutlass::Status::kSuccess) return cudaGetLastError();
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? cudaErrorLaunchFailure : error;
}

/// Checks, sets up and launches a CUTLASS device adapter (convolution or GEMM) on `stream`.
template <class Device>
cudaError_t run_on_device(const typename Device::Arguments& arguments, cudaStream_t stream) {
  Device device;
  if (device.can_implement(arguments) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
  if (Device::get_workspace_size(arguments) != 0) return cudaErrorNotSupported;  // none planned for
  if (device.initialize(arguments, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  return launch_error(device.run(stream));
}

#ifdef LTRAIN_FUSED_CONV_INSTANTIATE_CONV
/// Any convolution: CUTLASS's implicit GEMM (one consumer warpgroup, a CTA per tile).
template <class Element, int TileM, int TileN, int Stages>
struct ConvStatisticsKernel {
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Shape<cute::_64>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Epilogue = typename StatisticsEpilogue<Element, TileShape>::Tree;

  static constexpr int kAlignment = 8;  // 16 bytes of fp16/bf16
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile<TileN, 64>, float, float,
      void, cutlass::layout::TensorNHWC, kAlignment,  // no source tensor C
      Element, cutlass::layout::TensorNHWC, kAlignment,
      cutlass::epilogue::TmaWarpSpecialized, Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
      Element, cutlass::layout::TensorNHWC, kAlignment,
      Element, cutlass::layout::TensorNHWC, kAlignment,
      float, TileShape, ClusterShape, cutlass::conv::collective::StageCount<Stages>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Device = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  static cudaError_t run(const ConvShape& s, const ConvStatisticsArguments& a, cudaStream_t stream) {
    const int n = static_cast<int>(s.batch), h = static_cast<int>(s.height), w = static_cast<int>(s.width);
    const int c = static_cast<int>(s.in_channels), k = static_cast<int>(s.out_channels);
    const int r = static_cast<int>(s.kernel), pad = static_cast<int>(s.padding), step = static_cast<int>(s.stride);
    // x [n, h, w, c], w [k, r, r, c], both packed.
    ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, {n, h, w, c},
                         {int64_t{h} * w * c, int64_t{w} * c, c, 1}, {k, r, r, c},
                         {int64_t{r} * r * c, int64_t{r} * c, c, 1}, {pad, pad}, {pad, pad}, {step, step}, {1, 1},
                         1);
    // y's strides over ((q, p, n), k), as the epilogue indexes the GEMM's rows.
    typename CollectiveEpilogue::StrideD stride_y{};
    cute::get<0, 0>(stride_y) = problem.stride_C[2];
    cute::get<0, 1>(stride_y) = problem.stride_C[1];
    cute::get<0, 2>(stride_y) = problem.stride_C[0];

    typename Device::Arguments arguments{};
    arguments.problem_shape = problem;
    arguments.mainloop.ptr_A = static_cast<const Element*>(a.x);
    arguments.mainloop.ptr_B = static_cast<const Element*>(a.weight);
    arguments.epilogue.ptr_C = nullptr;
    arguments.epilogue.dC = stride_y;
    arguments.epilogue.ptr_D = static_cast<Element*>(a.y);
    arguments.epilogue.dD = stride_y;
    arguments.epilogue.thread = StatisticsEpilogue<Element, TileShape>::arguments(a.partial_sum, a.partial_square);
    cudaGetDevice(&arguments.hw_info.device_id);

    return run_on_device<Device>(arguments, stream);
  }
};

#else
/// 1x1 convolutions of stride 1 and no padding: in NHWC a plain GEMM y[M, K] = x[M, C] w[K, C]^T,
/// on CUTLASS's persistent cooperative kernel (two consumer warpgroups on a tile; the next tile's
/// loads overlap this one's epilogue).
template <class Element, int TileM, int TileN, int Stages>
struct GemmStatisticsKernel {
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Epilogue = typename StatisticsEpilogue<Element, TileShape>::Tree;
  static constexpr int kAlignment = 8;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile<TileN, 128>, float, float,
      void, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment,
      cutlass::epilogue::TmaWarpSpecializedCooperative, Epilogue>::CollectiveOp;
  // x: [M, C] row-major; w: [K, C], the GEMM's B stored N x K with K contiguous (column-major).
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::ColumnMajor, kAlignment,
      float, TileShape, ClusterShape, cutlass::gemm::collective::StageCount<Stages>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static cudaError_t run(const ConvShape& s, const ConvStatisticsArguments& a, cudaStream_t stream) {
    if (s.kernel != 1 || s.stride != 1 || s.padding != 0) return cudaErrorNotSupported;
    const int m = static_cast<int>(s.batch * s.height * s.width), n = static_cast<int>(s.out_channels);
    const int k = static_cast<int>(s.in_channels);
    typename Device::Arguments arguments{};
    arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    arguments.problem_shape = {m, n, k, 1};
    arguments.mainloop.ptr_A = static_cast<const Element*>(a.x);
    arguments.mainloop.dA = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(m, k, 1));
    arguments.mainloop.ptr_B = static_cast<const Element*>(a.weight);
    arguments.mainloop.dB = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(n, k, 1));
    const auto stride_y = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(m, n, 1));
    arguments.epilogue.ptr_C = nullptr;
    arguments.epilogue.dC = stride_y;
    arguments.epilogue.ptr_D = static_cast<Element*>(a.y);
    arguments.epilogue.dD = stride_y;
    arguments.epilogue.thread = StatisticsEpilogue<Element, TileShape>::arguments(a.partial_sum, a.partial_square);
    cudaGetDevice(&arguments.hw_info.device_id);
    arguments.hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(arguments.hw_info.device_id);

    return run_on_device<Device>(arguments, stream);
  }
};

#endif

}  // namespace ltrain::kernels::fused_conv_detail

/// Defines run_conv_statistics<TYPE, CONFIG> on KERNEL<ELEMENT, TILE_M, TILE_N, STAGES>
/// (ConvStatisticsKernel or GemmStatisticsKernel).
#define LTRAIN_FUSED_CONV_INSTANCE(KERNEL, TYPE, ELEMENT, CONFIG, TILE_M, TILE_N, STAGES)                \
  namespace ltrain::kernels::fused_conv_detail {                                                       \
  template <>                                                                                          \
  cudaError_t run_conv_statistics<TYPE, CONFIG>(const ConvShape& shape,                                \
                                                const ConvStatisticsArguments& arguments,              \
                                                cudaStream_t stream) {                                 \
    return KERNEL<ELEMENT, TILE_M, TILE_N, STAGES>::run(shape, arguments, stream);                     \
  }                                                                                                    \
  }
#endif
