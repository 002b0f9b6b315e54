// Convolutions as cuDNN backend graphs (conv_graph.h), each pass and fusion against float32
// operators. Built only with -DLTRAIN_CONV_GRAPH=ON, beside the graphs' benchmark
// (bench-conv-graph.sh); a GPU test, skipped without a usable GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "conv_graph.h"
#include "support.h"

namespace ltrain {
namespace {

/// Runs `plan` on torch tensors (channels_last; weights [K,C,R,S] channels_last, i.e. KRSC) with a
/// workspace from torch's allocator, on the current stream.
void run_conv_graph(const kernels::ConvGraph& plan, kernels::ConvBuffers buffers, const torch::Tensor& like) {
  const torch::Tensor workspace =
      torch::empty({std::max<int64_t>(plan.workspace_bytes(), 1)}, like.options().dtype(torch::kUInt8));
  const std::string error = plan.run(buffers, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
  ASSERT_EQ(error, "");
  torch::cuda::synchronize();
}

/// |got - want| at its largest, relative to want's largest magnitude.
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max() / want.abs().max().to(torch::kFloat64))
      .item<double>();
}

TEST(ConvGraph, EachPassAndFusionMatchesFloat32Operators_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  using kernels::ConvFusion;
  using kernels::ConvPass;
  const kernels::ConvShape shape{4, 32, 8, 8, 64, 3, 2, 1};  // 3x3, stride 2: 8x8 -> 4x4
  const auto channels_last = torch::MemoryFormat::ChannelsLast;
  for (const auto dtype : {torch::kFloat16, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto type = dtype == torch::kFloat16 ? kernels::ElementType::float16 : kernels::ElementType::bfloat16;
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    torch::manual_seed(3);
    const torch::Tensor x = torch::randn({4, 32, 8, 8}, options).contiguous(channels_last);
    const torch::Tensor weight = (0.1 * torch::randn({64, 32, 3, 3}, options)).contiguous(channels_last);
    const torch::Tensor grad_y = torch::randn({4, 64, 4, 4}, options).contiguous(channels_last);
    const torch::Tensor scale = torch::rand({32}, torch::kCUDA) + 0.5, bias = torch::rand({32}, torch::kCUDA) - 0.5;
    // float32 references: relu(x * scale + bias) as the prologue computes it, then the operators.
    const torch::Tensor activated = torch::relu(x.to(torch::kFloat32) * scale.view({1, 32, 1, 1}) +
                                                bias.view({1, 32, 1, 1}));
    const double tolerance = dtype == torch::kFloat16 ? 1e-2 : 3e-2;
    for (const bool prologue : {false, true}) {
      const torch::Tensor input = prologue ? activated : x.to(torch::kFloat32);
      torch::Tensor input_leaf = input.detach().requires_grad_();
      torch::Tensor weight_leaf = weight.to(torch::kFloat32).requires_grad_();
      const torch::Tensor want_y = torch::conv2d(input_leaf, weight_leaf, {}, {2, 2}, {1, 1});
      want_y.backward(grad_y.to(torch::kFloat32));
      for (const auto& [pass, statistics] :
           {std::pair{ConvPass::forward, false}, std::pair{ConvPass::forward, true},
            std::pair{ConvPass::backward_filter, false}, std::pair{ConvPass::backward_data, false}}) {
        if (pass == ConvPass::backward_data && prologue) continue;  // no prologue on gradients of x
        const ConvFusion fusion{prologue, statistics};
        SCOPED_TRACE(kernels::describe(pass, fusion));
        std::string why_not;
        auto plans = kernels::ConvGraph::candidates(type, pass, shape, fusion, 2, &why_not);
        if (plans.empty()) {
          // cuDNN has no engine for it here (bf16 prologues on an H200): the caller keeps its
          // operators, and the reason names the graph.
          EXPECT_NE(why_not.find("convolution"), std::string::npos) << why_not;
          std::cout << "  not taken: " << kernels::describe(pass, fusion) << ", " << c10::toString(dtype) << ": "
                    << why_not << "\n";
          continue;
        }
        for (const auto& candidate : plans) {
          const kernels::ConvGraph& plan = *candidate;
          SCOPED_TRACE(plan.engine());
          const auto parameter_dtype =
              plan.scale_bias_type() == kernels::ElementType::float32 ? torch::kFloat32 : dtype;
          const torch::Tensor scale_typed = scale.to(parameter_dtype), bias_typed = bias.to(parameter_dtype);
          torch::Tensor y = torch::empty({4, 64, 4, 4}, options).contiguous(channels_last);
          torch::Tensor grad_x = torch::empty_like(x), grad_weight = torch::empty_like(weight);
          torch::Tensor sum = torch::full({64}, -1.0f, torch::kCUDA);
          torch::Tensor square_sum = torch::full({64}, -1.0f, torch::kCUDA);
          kernels::ConvBuffers buffers;
          buffers.x = x.data_ptr();
          buffers.weight = weight.data_ptr();
          buffers.y = y.data_ptr();
          buffers.grad_y = grad_y.data_ptr();
          buffers.grad_x = grad_x.data_ptr();
          buffers.grad_weight = grad_weight.data_ptr();
          buffers.scale = scale_typed.data_ptr();
          buffers.bias = bias_typed.data_ptr();
          buffers.sum = sum.data_ptr<float>();
          buffers.square_sum = square_sum.data_ptr<float>();
          run_conv_graph(plan, buffers, x);
          if (pass == ConvPass::forward) {
            EXPECT_LT(relative_error(y, want_y), tolerance);
            if (statistics) {
              // Sums of 64 values a channel: measured against the sum of their magnitudes.
              const torch::Tensor magnitude = want_y.abs().sum({0, 2, 3}).to(torch::kFloat64);
              const auto sum_error = ((sum.to(torch::kFloat64) - want_y.sum({0, 2, 3})).abs() / magnitude).max();
              EXPECT_LT(sum_error.item<double>(), tolerance);
              EXPECT_LT(relative_error(square_sum, want_y.square().sum({0, 2, 3})), tolerance);
            }
          } else if (pass == ConvPass::backward_filter) {
            EXPECT_LT(relative_error(grad_weight, weight_leaf.grad()), tolerance);
          } else {
            EXPECT_LT(relative_error(grad_x, input_leaf.grad()), tolerance);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ltrain
