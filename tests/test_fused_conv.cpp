// ltrain's CUTLASS convolutions with BatchNorm statistics (kernels/fused_conv.h): every compiled
// configuration, fp16 and bf16, against float32 operators (torch's conv2d, and sums of its output
// in float64). Built only with -DLTRAIN_FUSED_CONV=ON, beside the kernels' benchmark
// (scripts/kernels/bench-fused-conv.sh); a GPU test, skipped where no sm_90 GPU runs the kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include <string>
#include <vector>

#include "ltrain/kernels/fused_conv.h"
#include "support.h"

namespace ltrain {
namespace {

using kernels::FusedConvConfig;
using kernels::ConvShape;

#define LTRAIN_REQUIRE_SM90()                                                                      \
  do {                                                                                             \
    LTRAIN_REQUIRE_CUDA();                                                                         \
    if (!kernels::fused_conv_device_supported(c10::cuda::current_device()))                       \
      GTEST_SKIP() << "the fused convolutions are built for sm_90a alone: no such GPU here";       \
  } while (false)

bool is_gemm_config(FusedConvConfig config) {
  return config == FusedConvConfig::gemm_256x64x64 || config == FusedConvConfig::gemm_256x128x64;
}

/// The shapes each configuration is checked on: rows (batch * out_height * out_width) and channels
/// that are not multiples of the tiles, strides, padding, and a 7x7 stem.
std::vector<ConvShape> shapes_for(FusedConvConfig config) {
  if (is_gemm_config(config))
    return {{3, 64, 7, 7, 64, 1, 1, 0}, {2, 128, 9, 9, 192, 1, 1, 0}, {4, 256, 4, 4, 1024, 1, 1, 0}};
  return {{3, 64, 7, 7, 64, 3, 1, 1}, {2, 32, 9, 9, 192, 3, 2, 1}, {2, 256, 8, 8, 512, 1, 2, 0},
          {2, 8, 16, 16, 64, 7, 2, 3}};
}

struct Outputs {
  torch::Tensor y, sum, square_sum;
};

Outputs run_fused(const torch::Tensor& x, const torch::Tensor& weight, const ConvShape& s,
                  FusedConvConfig config) {
  const auto type = x.scalar_type() == torch::kFloat16 ? kernels::ElementType::float16 : kernels::ElementType::bfloat16;
  // NaN everywhere beforehand: an element the kernels do not write fails the comparison.
  Outputs out{torch::full({s.batch, s.out_channels, s.out_height(), s.out_width()}, NAN, x.options())
                  .contiguous(torch::MemoryFormat::ChannelsLast),
              torch::full({s.out_channels}, NAN, x.options().dtype(torch::kFloat32)),
              torch::full({s.out_channels}, NAN, x.options().dtype(torch::kFloat32))};
  const size_t bytes = kernels::fused_conv_workspace_bytes(type, s, config);
  const torch::Tensor workspace = torch::empty({static_cast<int64_t>(bytes)}, x.options().dtype(torch::kUInt8));
  kernels::FusedConvForward arguments;
  arguments.x = x.data_ptr();
  arguments.weight = weight.data_ptr();
  arguments.y = out.y.data_ptr();
  arguments.sum = out.sum.data_ptr<float>();
  arguments.square_sum = out.square_sum.data_ptr<float>();
  arguments.workspace = workspace.data_ptr();
  arguments.workspace_bytes = bytes;
  const cudaError_t error =
      kernels::fused_conv_forward(type, s, arguments, c10::cuda::getCurrentCUDAStream().stream(), config);
  EXPECT_EQ(error, cudaSuccess) << cudaGetErrorString(error);
  torch::cuda::synchronize();
  return out;
}

TEST(FusedConv, EachConfigurationMatchesFloat32Operators_CUDA) {
  LTRAIN_REQUIRE_SM90();
  const auto channels_last = torch::MemoryFormat::ChannelsLast;
  for (const auto dtype : {torch::kFloat16, torch::kBFloat16}) {
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    for (int c = 0; c < static_cast<int>(FusedConvConfig::count); ++c) {
      const auto config = static_cast<FusedConvConfig>(c);
      for (const ConvShape& s : shapes_for(config)) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " + kernels::fused_conv_config_name(config) + ", " +
                     std::to_string(s.in_channels) + "->" + std::to_string(s.out_channels) + " " +
                     std::to_string(s.kernel) + "/" + std::to_string(s.stride) + " at " + std::to_string(s.height));
        torch::manual_seed(11 + c);
        // Positive-leaning inputs (as after a ReLU) give the sums a mean to get right.
        const torch::Tensor x = (torch::rand({s.batch, s.in_channels, s.height, s.width}, options) * 2 - 0.5)
                                    .contiguous(channels_last);
        const torch::Tensor weight =
            (0.1 * torch::randn({s.out_channels, s.in_channels, s.kernel, s.kernel}, options)).contiguous(channels_last);
        const torch::Tensor want = torch::conv2d(x.to(torch::kFloat32), weight.to(torch::kFloat32), {},
                                                 {s.stride, s.stride}, {s.padding, s.padding});
        const torch::Tensor want64 = want.to(torch::kFloat64);
        const Outputs got = run_fused(x, weight, s, config);

        // y in the element type against float32: its rounding, about 2^-8 (fp16 2^-11) relative.
        const double tolerance_y = dtype == torch::kFloat16 ? 2e-3 : 1e-2;
        const double error_y = ((got.y.to(torch::kFloat64) - want64).norm() / want64.norm()).item<double>();
        EXPECT_LT(error_y, tolerance_y);  // false for NaN: every element written
        // The sums come from the float32 accumulators: float32 rounding only, measured against the
        // channel's sum of magnitudes (the sums of squares against themselves).
        const torch::Tensor sum = want64.sum({0, 2, 3}), square = want64.square().sum({0, 2, 3});
        const torch::Tensor magnitude = want64.abs().sum({0, 2, 3});
        const double error_sum = ((got.sum.to(torch::kFloat64) - sum).abs() / magnitude).max().item<double>();
        const double error_square =
            ((got.square_sum.to(torch::kFloat64) - square).abs() / square).max().item<double>();
        EXPECT_LT(error_sum, 1e-4);
        EXPECT_LT(error_square, 1e-4);
      }
    }
  }
}

TEST(FusedConv, RefusesWhatItCannotRun) {
  const char* why = nullptr;
  EXPECT_FALSE(kernels::fused_conv_supported(kernels::ElementType::float32, {2, 64, 8, 8, 64, 1, 1, 0}, &why));
  EXPECT_STREQ(why, "the element type is not fp16 or bf16");
  EXPECT_FALSE(kernels::fused_conv_supported(kernels::ElementType::bfloat16, {2, 3, 8, 8, 64, 3, 1, 1}, &why));
  EXPECT_STREQ(why, "channels are not positive multiples of 8 (16-byte rows for TMA)");
  EXPECT_TRUE(kernels::fused_conv_supported(kernels::ElementType::bfloat16, {2, 8, 32, 32, 64, 3, 1, 1}, &why));
  EXPECT_EQ(why, nullptr);
  // A 3x3 convolution is no GEMM: the planner gives it an implicit-GEMM configuration.
  EXPECT_EQ(kernels::fused_conv_config(kernels::ElementType::bfloat16, {2, 64, 8, 8, 64, 3, 1, 1}),
            FusedConvConfig::conv_256x64x64);
  EXPECT_EQ(kernels::fused_conv_config(kernels::ElementType::bfloat16, {2, 64, 8, 8, 256, 1, 1, 0}),
            FusedConvConfig::gemm_256x64x64);
  EXPECT_EQ(kernels::fused_conv_config(kernels::ElementType::bfloat16, {2, 64, 8, 8, 256, 3, 1, 1}),
            FusedConvConfig::conv_128x128x64);
}

}  // namespace
}  // namespace ltrain
