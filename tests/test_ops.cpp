// The operators over ltrain's kernels and cuDNN's (ops/): each backend against float32 operators
// or ATen's, what it declines, and which backend the model and the optimizer run where. Most are
// GPU tests, skipped without a usable GPU or where ltrain's kernels have no code for it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ltrain/amp/autocast.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/models/resnet.h"
#include "ltrain/core/gpu.h"
#include "ltrain/ops/batch_norm.h"
#include "ltrain/ops/convolution.h"
#include "ltrain/ops/cross_entropy.h"
#include "ltrain/ops/gradient_kernels.h"
#include "ltrain/ops/max_pool.h"
#include "ltrain/optim/optimizer.h"
#include "support.h"

#if LTRAIN_WITH_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ltrain {
namespace {

// ---- BatchNorm ----------------------------------------------------------------------------------

/// A training-mode BatchNorm over `channels` channels with weights away from 1 and 0, on the GPU.
models::BatchNorm2d gpu_batch_norm(int64_t channels) {
  models::BatchNorm2d norm(channels);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(1.0 + 0.2 * torch::randn({channels}));
    norm->bias.copy_(0.2 * torch::randn({channels}));
    norm->running_mean.copy_(0.1 * torch::randn({channels}));
  }
  norm->to(torch::kCUDA);
  norm->train();
  return norm;
}

/// Which single-kernel BatchNorm a test calls: ltrain_given_statistics hands ltrain's kernels x's
/// per-channel sums and sums of squares, as a convolution with statistics would (ops/fused_conv.h).
enum class BatchNormPath { cudnn, ltrain, ltrain_given_statistics };

/// [2,C] float32: x's sums over batch and space, and of its squares, from float32 operators.
torch::Tensor statistics_of(const torch::Tensor& x) {
  const torch::Tensor x32 = x.detach().to(torch::kFloat32);
  return torch::stack({x32.sum({0, 2, 3}), x32.square().sum({0, 2, 3})}).contiguous();
}

/// What one call of a single-kernel BatchNorm left: output, gradients and running statistics.
struct BatchNormResult {
  torch::Tensor y, grad_x, grad_residual, grad_weight, grad_bias, running_mean, running_var;
};

/// y = bn(x), relu(bn(x)) or relu(bn(x) + residual) on `path` (`relu` false on the cuDNN path runs
/// the separate operators, which that path leaves to them) or, with `reference`, on torch's
/// operators in float32; then y.backward(grad_y). The same seed gives every path the same inputs,
/// drawn in `dtype` and, for the reference, converted exactly. y is undefined where the path declined.
BatchNormResult run_batch_norm(BatchNormPath path, bool reference, torch::ScalarType dtype,
                              const std::vector<int64_t>& shape, bool relu, bool add_residual, double offset = 0.0) {
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  torch::manual_seed(5);
  const int64_t channels = shape[1];
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  auto draw = [&](double shift) { return (torch::randn(shape, options) + shift).contiguous(at::MemoryFormat::ChannelsLast); };
  torch::Tensor x = draw(offset);
  torch::Tensor residual = add_residual ? draw(0.0) : torch::Tensor();
  const torch::Tensor grad_y = draw(0.0);
  models::BatchNorm2d norm = gpu_batch_norm(channels);
  if (reference) {
    x = x.to(torch::kFloat32);
    if (add_residual) residual = residual.to(torch::kFloat32);
  }
  x = x.detach().requires_grad_(true);
  if (add_residual) residual = residual.detach().requires_grad_(true);

  torch::Tensor y;
  if (reference) {
    y = torch::batch_norm(x, norm->weight, norm->bias, norm->running_mean, norm->running_var, true,
                          models::BatchNorm2dImpl::kMomentum, models::BatchNorm2dImpl::kEps, false);
    if (add_residual) y = y + residual;
    if (relu) y = torch::relu(y);
  } else {
    const ops::BatchNormParameters parameters{norm->weight, norm->bias, norm->running_mean, norm->running_var,
                                                 models::BatchNorm2dImpl::kMomentum, models::BatchNorm2dImpl::kEps};
    if (path == BatchNormPath::cudnn) y = ops::cudnn_batch_norm(x, residual, parameters);
    if (path == BatchNormPath::ltrain) y = ops::ltrain_batch_norm(x, residual, relu, parameters);
    if (path == BatchNormPath::ltrain_given_statistics)
      y = ops::ltrain_batch_norm(x, residual, relu, parameters, nullptr, statistics_of(x));
    if (!y.defined()) return {};
  }
  y.backward(reference ? grad_y.to(torch::kFloat32) : grad_y);
  return {y, x.grad(), add_residual ? residual.grad() : torch::Tensor(), norm->weight.grad(), norm->bias.grad(),
          norm->running_mean, norm->running_var};
}

/// ||a - b|| / ||b||, a converted to float32.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat32) - b).norm() / (b.norm() + 1e-12)).item<double>();
}

/// Every field of `result` within `tolerance` of `reference`'s (relative, as a whole tensor).
void expect_close(const BatchNormResult& result, const BatchNormResult& reference, double tolerance) {
  EXPECT_LT(relative_difference(result.y, reference.y), tolerance);
  EXPECT_LT(relative_difference(result.grad_x, reference.grad_x), tolerance);
  if (reference.grad_residual.defined()) {
    EXPECT_LT(relative_difference(result.grad_residual, reference.grad_residual), tolerance);
  }
  EXPECT_LT(relative_difference(result.grad_weight, reference.grad_weight), tolerance);
  EXPECT_LT(relative_difference(result.grad_bias, reference.grad_bias), tolerance);
  EXPECT_LT(relative_difference(result.running_mean, reference.running_mean), tolerance);
  EXPECT_LT(relative_difference(result.running_var, reference.running_var), tolerance);
}

double batch_norm_tolerance(torch::ScalarType dtype) { return dtype == torch::kHalf ? 5e-3 : 3e-2; }

TEST(CudnnBatchNorm, MatchesFloat32OperatorsInValuesGradientsAndRunningStatistics_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  if (!ops::cudnn_batch_norm_built()) GTEST_SKIP() << "this build has no cuDNN fused BatchNorm";
  // [16,64,8,8] channels_last: a ResNet-50 layer1 activation at batch 16.
  const std::vector<int64_t> shape{16, 64, 8, 8};
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const bool add_residual : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (add_residual ? " with residual" : ""));
      const BatchNormResult fused = run_batch_norm(BatchNormPath::cudnn, false, dtype, shape, true, add_residual);
      if (!fused.y.defined() && dtype == torch::kBFloat16) {
        std::cout << "cuDNN refuses the fused kernel in bf16 (the model runs three operators there)\n";
        continue;
      }
      ASSERT_TRUE(fused.y.defined()) << "cuDNN refused the fused kernel in fp16 NHWC";
      EXPECT_EQ(fused.y.scalar_type(), dtype);
      EXPECT_TRUE(fused.y.is_contiguous(at::MemoryFormat::ChannelsLast));
      expect_close(fused, run_batch_norm(BatchNormPath::cudnn, true, dtype, shape, true, add_residual),
                   batch_norm_tolerance(dtype));
    }
  }
}

TEST(LtrainBatchNorm, MatchesFloat32OperatorsForEachActivationAndShape_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  // ResNet-50 shapes at 32x32 input (layer1, layer4 at batch 4: 4 rows of 2048 channels), rows
  // that no block evenly divides, the narrowest channel count the kernels take, rows too many
  // for one cluster (8320 rows of 64 channels, 32.5 blocks' worth: the grid-wide reduction), and
  // more than one resident grid holds in registers (8.4M elements in 16448 rows: streamed).
  const std::vector<std::vector<int64_t>> shapes = {{16, 64, 8, 8}, {4, 2048, 1, 1}, {3, 256, 5, 3}, {2, 8, 33, 17},
                                                    {130, 64, 8, 8}, {257, 512, 8, 8}};
  std::set<std::string> reductions;
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const auto& shape : shapes) {
      for (const int activation : {0, 1, 2}) {
        const bool relu = activation > 0, add_residual = activation == 2;
        const std::string reduction = ops::ltrain_batch_norm_reduction(
            torch::empty(shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype)), relu, add_residual);
        reductions.insert(reduction);
        SCOPED_TRACE(::testing::Message() << dtype << " " << c10::IntArrayRef(shape)
                                          << (relu ? add_residual ? " add+relu" : " relu" : " no activation") << ", "
                                          << reduction << " reduction");
        const BatchNormResult ltrain = run_batch_norm(BatchNormPath::ltrain, false, dtype, shape, relu, add_residual);
        ASSERT_TRUE(ltrain.y.defined()) << "the kernels declined";
        EXPECT_EQ(ltrain.y.scalar_type(), dtype);
        EXPECT_TRUE(ltrain.y.is_contiguous(at::MemoryFormat::ChannelsLast));
        EXPECT_EQ(ltrain.y.grad_fn()->name().find("LtrainBatchNorm") != std::string::npos, true) << ltrain.y.grad_fn()->name();
        expect_close(ltrain, run_batch_norm(BatchNormPath::ltrain, true, dtype, shape, relu, add_residual),
                     batch_norm_tolerance(dtype));
      }
    }
  }
  // Every way of combining the blocks' sums was checked (clusters need sm_90 code on a GPU with them).
  if (ops::ltrain_batch_norm_cluster_fit(torch::kCUDA).runs) {
    EXPECT_TRUE(reductions.count("cluster"));
  } else {
    EXPECT_FALSE(reductions.count("cluster"));
  }
  EXPECT_TRUE(reductions.count("grid"));
  EXPECT_TRUE(reductions.count("streaming"));
}

TEST(LtrainBatchNorm, GivenStatisticsGiveTheSameValuesGradientsAndRunningStatistics_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  // The shapes of the reductions above (cluster, grid, streamed), and rows no block divides; a
  // mean of 3 beside a spread of 1, as a convolution's output may have, where E[x^2] - E[x]^2 cancels.
  const std::vector<std::vector<int64_t>> shapes = {{16, 64, 8, 8}, {3, 256, 5, 3}, {130, 64, 8, 8}, {257, 512, 8, 8}};
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const auto& shape : shapes) {
      for (const int activation : {0, 1, 2}) {
        const bool relu = activation > 0, add_residual = activation == 2;
        SCOPED_TRACE(::testing::Message() << dtype << " " << c10::IntArrayRef(shape)
                                          << (relu ? add_residual ? " add+relu" : " relu" : " no activation"));
        const BatchNormResult given = run_batch_norm(BatchNormPath::ltrain_given_statistics, false, dtype, shape,
                                                     relu, add_residual, /*offset=*/3.0);
        ASSERT_TRUE(given.y.defined()) << "the kernels declined";
        EXPECT_TRUE(given.y.is_contiguous(at::MemoryFormat::ChannelsLast));
        expect_close(given, run_batch_norm(BatchNormPath::ltrain, true, dtype, shape, relu, add_residual, 3.0),
                     batch_norm_tolerance(dtype));
      }
    }
  }
}

TEST(LtrainBatchNorm, StatisticsOfAnotherShapeAreComputedAgainNotUsed_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({8, 64, 4, 4}, options).contiguous(at::MemoryFormat::ChannelsLast);
  models::BatchNorm2d norm = gpu_batch_norm(64);
  const ops::BatchNormParameters parameters{norm->weight, norm->bias, norm->running_mean.clone(),
                                               norm->running_var.clone(), models::BatchNorm2dImpl::kMomentum,
                                               models::BatchNorm2dImpl::kEps};
  const torch::Tensor own = ops::ltrain_batch_norm(x, {}, true, parameters);
  const ops::BatchNormParameters again{norm->weight, norm->bias, norm->running_mean.clone(),
                                          norm->running_var.clone(), models::BatchNorm2dImpl::kMomentum,
                                          models::BatchNorm2dImpl::kEps};
  // Wrong statistics of a wrong shape ([2,32], float64, [64]): each would give other values if used.
  for (const torch::Tensor& wrong :
       {torch::full({2, 32}, 1e3, options.dtype(torch::kFloat32)), statistics_of(x).to(torch::kFloat64) * 2,
        torch::full({64}, 1e3, options.dtype(torch::kFloat32))}) {
    const torch::Tensor y = ops::ltrain_batch_norm(x, {}, true, again, nullptr, wrong);
    ASSERT_TRUE(y.defined());
    EXPECT_TRUE(torch::equal(y, own));
  }
  // And statistics that fit are used: doubled sums of squares give another output.
  torch::Tensor doubled = statistics_of(x);
  doubled[1].mul_(2.0);
  EXPECT_FALSE(torch::equal(ops::ltrain_batch_norm(x, {}, true, again, nullptr, doubled), own));
}

TEST(LtrainBatchNorm, AddsTheSecondOutputsGradientAsAutogradWouldHaveAddedIt_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  // A residual block's output reaches the loss twice, through the second output or through y
  // itself: the kernel's sum of the two gradients must be the sum autograd makes, bit for bit
  // with a cluster reduction ({16,64,8,8}), to float rounding with the grid's atomics (in
  // registers, and streamed).
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 64, 8, 8}, std::vector<int64_t>{130, 64, 8, 8},
                                            std::vector<int64_t>{257, 512, 8, 8}}) {
    const std::string reduction = ops::ltrain_batch_norm_reduction(torch::empty(shape, options), true, true);
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << ", " << reduction << " reduction");
    torch::manual_seed(9);
    auto draw = [&] { return torch::randn(shape, options).contiguous(at::MemoryFormat::ChannelsLast); };
    const torch::Tensor x0 = draw(), residual0 = draw(), grad_first = draw(), grad_second = draw();
    models::BatchNorm2d norm = gpu_batch_norm(shape[1]);
    const ops::BatchNormParameters parameters{norm->weight, norm->bias, norm->running_mean, norm->running_var,
                                                 models::BatchNorm2dImpl::kMomentum, models::BatchNorm2dImpl::kEps};
    // kBoth: through both outputs; kOnce: through y, their sum; kSecondOnly: y unused.
    enum Use { kBoth, kOnce, kSecondOnly };
    auto gradients = [&](Use use) {
      const torch::Tensor x = x0.clone().requires_grad_(true), residual = residual0.clone().requires_grad_(true);
      norm->weight.mutable_grad() = torch::Tensor();
      norm->bias.mutable_grad() = torch::Tensor();
      torch::Tensor second;
      const torch::Tensor y =
          ops::ltrain_batch_norm(x, residual, true, parameters, use == kOnce ? nullptr : &second);
      EXPECT_TRUE(y.defined());
      if (use == kOnce) {
        y.backward(grad_first + grad_second);
      } else {
        EXPECT_EQ(second.data_ptr(), y.data_ptr());
        if (use == kSecondOnly) second.backward(grad_first + grad_second);
        else torch::autograd::backward({y, second}, {grad_first, grad_second});
      }
      return std::vector<torch::Tensor>{x.grad(), residual.grad(), norm->weight.grad(), norm->bias.grad()};
    };
    const auto once = gradients(kOnce);
    for (const Use use : {kBoth, kSecondOnly}) {
      const auto other = gradients(use);
      for (size_t i = 0; i < once.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << (use == kSecondOnly ? "second output alone" : "both outputs")
                                          << ", gradient " << i);
        if (reduction == "cluster") EXPECT_TRUE(torch::equal(other[i], once[i]));
        else EXPECT_LT(relative_difference(other[i], once[i].to(torch::kFloat32)), 1e-3);
      }
    }
    // Without a residual there is no second output (the kernels add a second gradient only there).
    torch::Tensor untouched;
    const torch::Tensor y = ops::ltrain_batch_norm(x0, {}, true, parameters, &untouched);
    EXPECT_TRUE(y.defined());
    EXPECT_FALSE(untouched.defined());
  }
}

TEST(LtrainBatchNorm, ReluPassesTheGradientExactlyWhereItsOutputIsPositive_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  // Each channel's x is its mean m, or m -+ 1 (half the rows, a quarter each): the mean and the
  // variance (0.5) come out exact, and on the rows at the mean x * scale + offset, with zero bias, is
  // what rounding left of m * scale: tiny, of either sign or zero, in fp16 often below its smallest
  // subnormal. The gradient may pass exactly where y > 0; a backward that took y's sign from another
  // rounding (no fused multiply-add, or no rounding to the element type) passes it on other rows.
  // grad_y is 1 or 2, so grad_bias, the sum of what passed, is an integer, exact in float32. In
  // registers (which read y), streamed (after a ReLU alone recomputing y from x, after a residual
  // add reading the forward's mask of y > 0), and with the statistics given. The residual, where
  // added, is zero: the same edge, and grad_residual must be exactly what passed.
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  std::set<std::string> reductions;
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 64, 8, 8}, std::vector<int64_t>{130, 64, 8, 8},
                                              std::vector<int64_t>{257, 512, 8, 8}}) {
      for (const bool given_statistics : {false, true}) {
        for (const bool add_residual : {false, true}) {
          const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
          const std::string reduction =
              ops::ltrain_batch_norm_reduction(torch::empty(shape, options), true, add_residual);
          reductions.insert(reduction);
          SCOPED_TRACE(::testing::Message() << dtype << " " << c10::IntArrayRef(shape) << ", " << reduction
                                            << " reduction" << (given_statistics ? ", statistics given" : "")
                                            << (add_residual ? ", residual added" : ""));
          const int64_t channels = shape[1];
          const auto float32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
          const torch::Tensor channel = torch::arange(channels, float32);
          // [N,1,H,W]: each row's offset from the mean, by its index in NHW order: -1, 0, 0, +1, ...
          const torch::Tensor row = torch::arange(shape[0] * shape[2] * shape[3], float32).view({shape[0], 1, shape[2], shape[3]});
          const torch::Tensor quarter = torch::remainder(row, 4.0);
          const torch::Tensor from_mean = (quarter == 3.0).to(torch::kFloat32) - (quarter == 0.0).to(torch::kFloat32);
          const torch::Tensor mean = 1.0 + torch::remainder(channel, 7.0);  // [C]: 1 to 7
          const torch::Tensor x = (mean.view({1, channels, 1, 1}) + from_mean)
                                      .to(dtype)
                                      .contiguous(at::MemoryFormat::ChannelsLast)
                                      .requires_grad_(true);
          models::BatchNorm2d norm(channels);
          {
            torch::NoGradGuard no_grad;
            norm->weight.copy_(0.05 + 0.003 * torch::arange(channels, torch::kFloat32));
            norm->bias.zero_();
          }
          norm->to(torch::kCUDA);
          const ops::BatchNormParameters parameters{norm->weight, norm->bias, norm->running_mean, norm->running_var,
                                                       models::BatchNorm2dImpl::kMomentum, models::BatchNorm2dImpl::kEps};
          const torch::Tensor residual =
              add_residual ? torch::zeros(shape, options).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true)
                           : torch::Tensor();
          const torch::Tensor y =
              ops::ltrain_batch_norm(x, residual, true, parameters, nullptr,
                                     given_statistics ? statistics_of(x) : torch::Tensor());
          ASSERT_TRUE(y.defined());
          torch::manual_seed(11);
          const torch::Tensor grad_y = torch::randint(1, 3, shape, options).contiguous(at::MemoryFormat::ChannelsLast);
          y.backward(grad_y);
          const torch::Tensor output = y.detach();
          const torch::Tensor passed = grad_y.to(torch::kFloat64) * (output > 0).to(torch::kFloat64);
          const torch::Tensor expected_grad_bias = passed.sum({0, 2, 3}).to(torch::kFloat32);
          EXPECT_TRUE(torch::equal(norm->bias.grad(), expected_grad_bias))
              << "largest difference " << (norm->bias.grad() - expected_grad_bias).abs().max().item<float>();
          if (add_residual) {
            EXPECT_TRUE(torch::equal(residual.grad(), passed.to(dtype)));
          }
          // The rows at the mean hold both sides of the ReLU's edge, or the test would prove nothing.
          const torch::Tensor at_mean = (from_mean == 0.0).expand_as(output);
          EXPECT_GT(((output == 0) & at_mean).sum().item<int64_t>(), 0);
          EXPECT_GT(((output > 0) & at_mean).sum().item<int64_t>(), 0);
        }
      }
    }
  }
  EXPECT_TRUE(reductions.count("streaming"));
}

TEST(LtrainBatchNorm, KeepsTheSpreadOfOffsetChannelsAndLeavesNothingForTheNextCall_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  // Channels centred at 64 with unit spread: sums of squares taken around 0 would lose the
  // variance to float32 cancellation; the kernels sum around each channel's first value. One
  // shape for each reduction (1024 rows: one cluster; 8192: the grid; 66560: streamed).
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{64, 128, 4, 4}, std::vector<int64_t>{128, 128, 8, 8},
                                            std::vector<int64_t>{520, 128, 8, 16}}) {
    const std::string reduction =
        ops::ltrain_batch_norm_reduction(torch::empty(shape, torch::dtype(torch::kHalf).device(torch::kCUDA)), true, true);
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << ", " << reduction << " reduction");
    const BatchNormResult first = run_batch_norm(BatchNormPath::ltrain, false, torch::kHalf, shape, true, true, 64.0);
    ASSERT_TRUE(first.y.defined());
    expect_close(first, run_batch_norm(BatchNormPath::ltrain, true, torch::kHalf, shape, true, true, 64.0),
                 batch_norm_tolerance(torch::kHalf));
    // The grid's kernels add into per-channel sums that each launch zeroes for the next: a second
    // call that found them non-zero would be off by the first call's statistics. A cluster's sums
    // are added in a fixed order, so its second call repeats the first bit for bit.
    const BatchNormResult again = run_batch_norm(BatchNormPath::ltrain, false, torch::kHalf, shape, true, true, 64.0);
    for (const auto& [a, b] :
         {std::pair{first.y, again.y}, std::pair{first.grad_x, again.grad_x}, std::pair{first.grad_weight, again.grad_weight},
          std::pair{first.grad_bias, again.grad_bias}, std::pair{first.running_var, again.running_var}}) {
      if (reduction == "cluster") {
        EXPECT_TRUE(torch::equal(a, b));
      } else {
        EXPECT_LT(relative_difference(a, b.to(torch::kFloat32)), 1e-3);
      }
    }
  }
}

TEST(LtrainBatchNorm, DeclinesWhatTheKernelsDoNotTake_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  auto declined = [](const std::vector<int64_t>& shape, torch::ScalarType dtype, bool channels_last) {
    models::BatchNorm2d norm = gpu_batch_norm(shape[1]);
    torch::Tensor x = torch::randn(shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype));
    if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const torch::Tensor running_mean = norm->running_mean.clone();
    const torch::Tensor y = ops::ltrain_batch_norm(
        x, {}, true,
        {norm->weight, norm->bias, norm->running_mean, norm->running_var, models::BatchNorm2dImpl::kMomentum,
         models::BatchNorm2dImpl::kEps});
    return !y.defined() && torch::equal(running_mean, norm->running_mean);  // and changed nothing
  };
  EXPECT_TRUE(declined({4, 96, 4, 4}, torch::kHalf, true));     // 96 channels: not a power of two
  EXPECT_TRUE(declined({2, 4096, 1, 1}, torch::kHalf, true));   // more than 2048 channels
  EXPECT_TRUE(declined({4, 64, 4, 4}, torch::kFloat32, true));  // float32
  EXPECT_TRUE(declined({4, 64, 4, 4}, torch::kHalf, false));    // NCHW
  EXPECT_TRUE(declined({1, 64, 1, 1}, torch::kHalf, true));     // one value per channel
  EXPECT_FALSE(declined({4, 64, 4, 4}, torch::kHalf, true));
  EXPECT_FALSE(declined({128, 64, 32, 32}, torch::kHalf, true));  // 8.4M elements: streamed
  // The atomic sums are not bitwise repeatable: precision.deterministic (cuDNN's flag) and
  // torch's deterministic algorithms get cuDNN or ATen.
  auto& context = at::globalContext();
  const bool deterministic_cudnn = context.deterministicCuDNN();
  const bool deterministic = context.deterministicAlgorithms();
  const bool warn_only = context.deterministicAlgorithmsWarnOnly();
  context.setDeterministicCuDNN(true);
  const bool declined_for_cudnn_flag = declined({4, 64, 4, 4}, torch::kHalf, true);
  context.setDeterministicCuDNN(deterministic_cudnn);
  context.setDeterministicAlgorithms(true, false);
  const bool declined_for_algorithms = declined({4, 64, 4, 4}, torch::kHalf, true);
  context.setDeterministicAlgorithms(deterministic, warn_only);
  EXPECT_TRUE(declined_for_cudnn_flag);
  EXPECT_TRUE(declined_for_algorithms);
}

TEST(LtrainBatchNorm, DependentLaunchesGiveTheNumbersOfPlainLaunches_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
#if LTRAIN_WITH_CUDA
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  // Launched as programmatic dependents (sm_90 and later), the kernels may be placed while the
  // kernel before them still runs, and must wait for its writes: here a copy writes x, and the
  // backward's incoming gradient, right before each launch, queued behind a spin that keeps the
  // GPU busy. One shape per reduction: the cluster's fixed-order sums give the same bits, the
  // grid's and the streamed ones' atomics the same numbers to their order's rounding.
  struct DependentLaunchOff {
    ~DependentLaunchOff() { ops::set_batch_norm_dependent_launch(ops::BatchNormDependentLaunch::none); }
  } off_afterwards;
  auto run = [](const std::vector<int64_t>& shape, ops::BatchNormDependentLaunch which) {
    ops::set_batch_norm_dependent_launch(which);
    torch::manual_seed(5);
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
    const torch::Tensor source = torch::randn(shape, options).contiguous(at::MemoryFormat::ChannelsLast);
    const torch::Tensor gradient_source = torch::randn(shape, options).contiguous(at::MemoryFormat::ChannelsLast);
    models::BatchNorm2d norm = gpu_batch_norm(shape[1]);
    torch::Tensor x = torch::empty_like(source);
    at::cuda::sleep(1 << 20);
    x.copy_(source);
    x.requires_grad_(true);
    const torch::Tensor y = ops::ltrain_batch_norm(
        x, {}, /*relu=*/true,
        {norm->weight, norm->bias, norm->running_mean, norm->running_var, models::BatchNorm2dImpl::kMomentum,
         models::BatchNorm2dImpl::kEps});
    torch::Tensor grad_y = torch::empty_like(gradient_source);
    at::cuda::sleep(1 << 20);
    grad_y.copy_(gradient_source);
    y.backward(grad_y);
    return BatchNormResult{y, x.grad(), {}, norm->weight.grad(), norm->bias.grad(), norm->running_mean,
                           norm->running_var};
  };
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 64, 8, 8}, std::vector<int64_t>{130, 64, 8, 8},
                                            std::vector<int64_t>{257, 512, 8, 8}}) {
    const std::string reduction = ops::ltrain_batch_norm_reduction(
        torch::empty(shape, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf)), true, false);
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << ", " << reduction << " reduction");
    const BatchNormResult plain = run(shape, ops::BatchNormDependentLaunch::none);
    ASSERT_TRUE(plain.y.defined()) << "the kernels declined";
    // clusters: only the cluster reduction's launches go early; all: every launch.
    for (const auto which : {ops::BatchNormDependentLaunch::clusters, ops::BatchNormDependentLaunch::all}) {
      SCOPED_TRACE(which == ops::BatchNormDependentLaunch::all ? "all launches dependent" : "cluster launches dependent");
      const BatchNormResult dependent = run(shape, which);
      ASSERT_TRUE(dependent.y.defined()) << "the kernels declined";
      if (reduction == "cluster") {
        for (const auto& [a, b] : {std::pair{dependent.y, plain.y}, std::pair{dependent.grad_x, plain.grad_x},
                                   std::pair{dependent.grad_weight, plain.grad_weight},
                                   std::pair{dependent.running_var, plain.running_var}})
          EXPECT_TRUE(torch::equal(a, b));
      } else {
        expect_close(dependent, plain, 1e-3);
      }
    }
  }
#endif
}

// ---- Max pooling --------------------------------------------------------------------------------

TEST(MaxPool, AtenRunsItOffTheGpu) {
  // ltrain's kernels are CUDA-only; on the CPU the operator is ATen's, with its gradients.
  torch::manual_seed(4);
  const torch::Tensor input =
      torch::randn({2, 8, 9, 9}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_();
  EXPECT_FALSE(ops::takes_ltrain_max_pool(input, 3, 2, 1));
  const torch::Tensor pooled = ops::max_pool2d(input, 3, 2, 1);
  EXPECT_TRUE(torch::equal(pooled, torch::max_pool2d(input, {3, 3}, {2, 2}, {1, 1})));
  pooled.sum().backward();
  EXPECT_EQ(input.grad().sum().item<float>(), 2 * 8 * 5 * 5);  // each output passes its 1 to one input
}

TEST(MaxPool, LtrainKernelsMatchAtenInValuesAndGradients_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_max_pool_fit(torch::kCUDA));
  struct Window {
    int64_t kernel, stride, padding;
  };
  const std::vector<std::vector<int64_t>> shapes = {{4, 64, 16, 16}, {3, 16, 15, 13}};
  const std::vector<Window> windows = {{3, 2, 1}, {2, 2, 0}, {3, 1, 1}};
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    for (const auto& shape : shapes) {
      for (const Window& w : windows) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << c10::IntArrayRef(shape) << " window " << w.kernel
                                          << "/" << w.stride << "/" << w.padding);
        torch::manual_seed(3);
        // Whole numbers: many windows hold equal maxima, where the first one must win as in ATen.
        torch::Tensor input = (torch::randn(shape) * 2).round();
        input[0][1][2][3] = std::numeric_limits<float>::quiet_NaN();  // a NaN wins its windows
        input = input.to(torch::kCUDA, dtype).contiguous(torch::MemoryFormat::ChannelsLast);
        ASSERT_TRUE(ops::takes_ltrain_max_pool(input, w.kernel, w.stride, w.padding));
        const torch::Tensor ltrain_input = input.clone().requires_grad_();
        const torch::Tensor aten_input = input.clone().requires_grad_();
        const torch::Tensor ltrain = ops::max_pool2d(ltrain_input, w.kernel, w.stride, w.padding);
        const torch::Tensor aten = torch::max_pool2d(aten_input, {w.kernel, w.kernel}, {w.stride, w.stride},
                                                     {w.padding, w.padding});
        ASSERT_EQ(ltrain.sizes(), aten.sizes());
        EXPECT_TRUE(ltrain.is_contiguous(torch::MemoryFormat::ChannelsLast));
        EXPECT_TRUE(torch::allclose(ltrain, aten, 0.0, 0.0, /*equal_nan=*/true));
        const torch::Tensor grad =
            torch::randn(aten.sizes(), aten.options()).contiguous(torch::MemoryFormat::ChannelsLast);
        ltrain.backward(grad);
        aten.backward(grad);
        // The same terms summed in float32 in the same order: equal up to the final rounding.
        const double tolerance = dtype == torch::kFloat32 ? 1e-6 : 1e-2;
        EXPECT_TRUE(torch::allclose(ltrain_input.grad().to(torch::kFloat32), aten_input.grad().to(torch::kFloat32), 0.0,
                                    tolerance));
        EXPECT_EQ(ltrain_input.grad().count_nonzero().item<int64_t>(), aten_input.grad().count_nonzero().item<int64_t>());
      }
    }
  }
}

TEST(MaxPool, AtenTakesInputsTheKernelsDoNotFit_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Tensor nchw = torch::randn({2, 64, 8, 8}, torch::kCUDA);
  const torch::Tensor nhwc = nchw.contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(ops::takes_ltrain_max_pool(nchw, 3, 2, 1));
  EXPECT_EQ(ops::takes_ltrain_max_pool(nhwc, 3, 2, 1), ops::ltrain_max_pool_fit(torch::kCUDA).runs);
  EXPECT_FALSE(ops::takes_ltrain_max_pool(torch::randn({2, 6, 8, 8}, torch::kCUDA).contiguous(
                                              torch::MemoryFormat::ChannelsLast),
                                          3, 2, 1));  // 6 channels fill no 16-byte vector
  EXPECT_FALSE(ops::takes_ltrain_max_pool(nhwc.to(torch::kFloat64), 3, 2, 1));
  EXPECT_TRUE(torch::equal(ops::max_pool2d(nhwc, 3, 2, 1, ops::MaxPoolBackends{false}),
                           torch::max_pool2d(nhwc, {3, 3}, {2, 2}, {1, 1})));
}

// ---- The classification loss -------------------------------------------------------------------

/// ATen's label-smoothed cross-entropy of `logits` cast to float32, and its gradient
/// d(loss * grad_scale) / d logits in the logits' dtype.
std::pair<torch::Tensor, torch::Tensor> aten_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                                          double smoothing, double grad_scale) {
  const torch::Tensor input = logits.detach().clone().requires_grad_();
  const torch::Tensor loss = torch::nn::functional::cross_entropy(
      input.to(torch::kFloat32), labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
  (loss * grad_scale).backward();
  return {loss.detach(), input.grad()};
}

TEST(CrossEntropy, AtenComputesItOffTheGpu) {
  torch::manual_seed(5);
  const torch::Tensor logits = torch::randn({6, 10}, torch::requires_grad());
  const torch::Tensor labels = torch::randint(0, 10, {6}, torch::kInt64);
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(logits, labels, 0.1));
  const torch::Tensor loss = ops::cross_entropy(logits, labels, 0.1);
  loss.backward();
  const auto [expected_loss, expected_grad] = aten_cross_entropy(logits, labels, 0.1, 1.0);
  EXPECT_TRUE(torch::equal(loss, expected_loss));
  EXPECT_TRUE(torch::equal(logits.grad(), expected_grad));
}

TEST(CrossEntropy, LtrainKernelsMatchAtenInLossAndGradients_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_cross_entropy_fit(torch::kCUDA));
  // Rows beyond one block's threads, CIFAR-100's classes and the most the kernel takes, one class.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 10}, {2500, 10}, {37, 100}, {3, 1024}, {5, 1}};
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    for (const auto& [rows, classes] : shapes) {
      for (const double smoothing : {0.0, 0.1, 0.9}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << rows << "x" << classes << " smoothing " << smoothing);
        torch::manual_seed(rows + classes);
        const torch::Tensor logits = (torch::randn({rows, classes}) * 4).to(torch::kCUDA, dtype);
        const torch::Tensor labels =
            torch::randint(0, classes, {rows}, torch::TensorOptions(torch::kCUDA).dtype(torch::kInt64));
        ASSERT_TRUE(ops::takes_ltrain_cross_entropy(logits, labels, smoothing));
        const torch::Tensor input = logits.clone().requires_grad_();
        const torch::Tensor loss = ops::cross_entropy(input, labels, smoothing);
        EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
        EXPECT_EQ(loss.dim(), 0);
        // The GradScaler's factor reaches the gradient through the backward pass.
        (loss * 1024.0).backward();
        ASSERT_EQ(input.grad().scalar_type(), dtype);
        const auto [expected_loss, expected_grad] = aten_cross_entropy(logits, labels, smoothing, 1024.0);
        // The same float32 terms, summed in other orders.
        const double expected_value = expected_loss.item<double>();
        EXPECT_NEAR(loss.item<double>(), expected_value, 1e-5 * std::max(1.0, expected_value));
        // float32 gradients agree to a few roundings; fp16/bf16 ones to one rounding of the final cast.
        const double tolerance = dtype == torch::kFloat32 ? 1e-5 : (dtype == torch::kFloat16 ? 2e-3 : 1e-2);
        const torch::Tensor grad = input.grad().to(torch::kFloat32), expected = expected_grad.to(torch::kFloat32);
        EXPECT_TRUE(torch::allclose(grad, expected, tolerance, 1e-3 * 1024.0 / static_cast<double>(rows * classes)))
            << (grad - expected).abs().max().item<double>();
      }
    }
  }
}

TEST(CrossEntropy, LtrainKernelsGiveTheSameBitsEveryTime_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_cross_entropy_fit(torch::kCUDA));
  torch::manual_seed(8);
  const torch::Tensor logits = torch::randn({1500, 10}, torch::kCUDA).to(torch::kFloat16);
  const torch::Tensor labels = torch::randint(0, 10, {1500}, torch::TensorOptions(torch::kCUDA).dtype(torch::kInt64));
  std::vector<torch::Tensor> losses, grads;
  for (int round = 0; round < 3; ++round) {
    const torch::Tensor input = logits.clone().requires_grad_();
    const torch::Tensor loss = ops::cross_entropy(input, labels, 0.1);
    loss.backward();
    losses.push_back(loss.detach());
    grads.push_back(input.grad());
  }
  for (int round = 1; round < 3; ++round) {
    EXPECT_TRUE(torch::equal(losses[round], losses[0]));
    EXPECT_TRUE(torch::equal(grads[round], grads[0]));
  }
}

TEST(CrossEntropy, ALabelOutsideTheClassesGivesANanLossAndTheGpuGoesOn_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_cross_entropy_fit(torch::kCUDA));
  const torch::Tensor logits = torch::randn({4, 10}, torch::kCUDA).requires_grad_();
  const auto on_gpu = torch::TensorOptions(torch::kCUDA).dtype(torch::kInt64);
  for (const int64_t bad_label : {int64_t{10}, int64_t{-1}, int64_t{-100}}) {
    SCOPED_TRACE(bad_label);
    const torch::Tensor labels = torch::tensor({int64_t{1}, bad_label, int64_t{3}, int64_t{0}}, on_gpu);
    const torch::Tensor loss = ops::cross_entropy(logits, labels, 0.1);
    EXPECT_TRUE(std::isnan(loss.item<float>()));
    logits.mutable_grad() = torch::Tensor();
    loss.backward();
    // The bad row's gradient is NaN, the others' are finite: a GradScaler skips the step.
    EXPECT_TRUE(logits.grad()[1].isnan().all().item<bool>());
    EXPECT_TRUE(logits.grad()[0].isfinite().all().item<bool>());
  }
  EXPECT_EQ(torch::ones({3}, torch::kCUDA).sum().item<float>(), 3.0f);  // no device-side assertion
}

TEST(CrossEntropy, UnderAutocastItComputesInFloat32FromTheHalfLogits_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_cross_entropy_fit(torch::kCUDA));
  torch::manual_seed(9);
  const torch::Tensor features = torch::randn({64, 32}, torch::kCUDA);
  const torch::Tensor weight = torch::randn({10, 32}, torch::kCUDA);
  const torch::Tensor labels = torch::randint(0, 10, {64}, torch::TensorOptions(torch::kCUDA).dtype(torch::kInt64));
  torch::Tensor ltrain_weight = weight.clone().requires_grad_(), aten_weight = weight.clone().requires_grad_();
  torch::Tensor ltrain_loss, aten_loss;
  {
    const amp::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
    const torch::Tensor ltrain_logits = torch::nn::functional::linear(features, ltrain_weight);  // [64,10] fp16
    ASSERT_EQ(ltrain_logits.scalar_type(), torch::kHalf);
    ltrain_loss = ops::cross_entropy(ltrain_logits, labels, 0.1);
    // The reference: ATen's loss of the same fp16 logits cast to float32 first.
    const torch::Tensor aten_logits = torch::nn::functional::linear(features, aten_weight).to(torch::kFloat32);
    aten_loss = torch::nn::functional::cross_entropy(
        aten_logits, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(0.1));
  }
  EXPECT_EQ(ltrain_loss.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(ltrain_loss.item<double>(), aten_loss.item<double>(), 1e-5 * aten_loss.item<double>());
  ltrain_loss.backward();
  aten_loss.backward();
  EXPECT_TRUE(torch::allclose(ltrain_weight.grad(), aten_weight.grad(), 1e-2, 1e-3));
}

TEST(CrossEntropy, AtenTakesInputsTheKernelsDoNotFit_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto on_gpu = torch::TensorOptions(torch::kCUDA);
  const torch::Tensor logits = torch::randn({8, 10}, on_gpu);
  const torch::Tensor labels = torch::randint(0, 10, {8}, on_gpu.dtype(torch::kInt64));
  EXPECT_EQ(ops::takes_ltrain_cross_entropy(logits, labels, 0.1), ops::ltrain_cross_entropy_fit(torch::kCUDA).runs);
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(torch::randn({10, 8}, on_gpu).t(), labels, 0.1));  // not contiguous
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(logits.to(torch::kFloat64), labels, 0.1));
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(torch::randn({8, 1025}, on_gpu), labels, 0.1));
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(logits, labels.to(torch::kInt32), 0.1));
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(logits, labels.cpu(), 0.1));
  EXPECT_FALSE(ops::takes_ltrain_cross_entropy(logits.unsqueeze(0), labels, 0.1));
  const auto [expected_loss, expected_grad] = aten_cross_entropy(logits, labels, 0.1, 1.0);
  EXPECT_TRUE(torch::equal(ops::cross_entropy(logits, labels, 0.1, ops::CrossEntropyBackends{false}), expected_loss));
}

// ---- The optimizer step -------------------------------------------------------------------------

TEST(GradientKernels, SgdReadsLowPrecisionGradientsAsTheirFloat32Values_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_gradient_kernels_fit(torch::kCUDA));
  // Steps from fp16 and bf16 gradients must equal, bit for bit, steps from the same values
  // widened to float32 first: the kernel converts each element exactly and does the rest alike.
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes{{64, 16, 3, 3}, {64}, {10, 64}};
  for (torch::ScalarType dtype : {torch::kHalf, torch::kBFloat16}) {
    std::vector<torch::Tensor> initial, low;
    for (const auto& shape : shapes) {
      initial.push_back(torch::randn(shape, cuda));
      low.push_back((torch::randn(shape, cuda) * 512).to(dtype));
    }
    auto run = [&](bool widen) {
      std::vector<torch::Tensor> params, buffers, grads;
      for (size_t i = 0; i < shapes.size(); ++i) {
        params.push_back(initial[i].clone());
        buffers.push_back(torch::zeros_like(initial[i]));
        grads.push_back(widen ? low[i].to(torch::kFloat32) : low[i]);
      }
      const torch::Tensor lr = torch::full({}, 0.1, cuda);
      const torch::Tensor grad_scale = torch::full({1}, 512.0, cuda), found_inf = torch::zeros({1}, cuda);
      for (int step = 0; step < 3; ++step)
        ops::sgd_step(ops::SgdBackend::ltrain, params, grads, buffers, {5e-4, 0.0, 5e-4}, 0.9, true, lr, grad_scale,
                      found_inf);
      params.insert(params.end(), buffers.begin(), buffers.end());
      return params;
    };
    const std::vector<torch::Tensor> from_low = run(false), from_float32 = run(true);
    for (size_t i = 0; i < from_low.size(); ++i) EXPECT_TRUE(torch::equal(from_low[i], from_float32[i])) << i;
  }
}

TEST(GradientKernels, SgdPairsGradientAndParameterElementsWhateverTheirLayouts_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_gradient_kernels_fit(torch::kCUDA));
  // channels_last parameters: a 3x3 convolution's weight, whose contiguous gradient is in another
  // order, and a 1x1 convolution's, whose contiguous gradient has other strides but the same
  // order. Either way a step equals the step from the gradient in the parameter's ltrain layout.
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(7);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8, 4, 3, 3}, std::vector<int64_t>{8, 4, 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape));
    const torch::Tensor initial = torch::randn(shape, cuda).contiguous(at::MemoryFormat::ChannelsLast);
    const torch::Tensor gradient = torch::randn(shape, cuda).to(torch::kHalf);  // contiguous
    auto step_with = [&](const torch::Tensor& grad) {
      std::vector<torch::Tensor> params{initial.clone(at::MemoryFormat::ChannelsLast)};
      std::vector<torch::Tensor> buffers{torch::zeros_like(params[0])};
      const torch::Tensor lr = torch::full({}, 0.1, cuda);
      for (int step = 0; step < 2; ++step)
        ops::sgd_step(ops::SgdBackend::ltrain, params, {grad}, buffers, {5e-4}, 0.9, false, lr, {}, {});
      return params[0];
    };
    EXPECT_TRUE(torch::equal(step_with(gradient), step_with(gradient.contiguous(at::MemoryFormat::ChannelsLast))));
    EXPECT_FALSE(torch::equal(step_with(gradient), initial));
  }
}

TEST(GradientKernels, SgdWritesEachParametersLowPrecisionCopyUnlessTheStepIsSkipped_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_gradient_kernels_fit(torch::kCUDA));
  // The copies (fp16, bf16, one parameter without) must hold exactly the cast of the updated
  // parameters, as amp::LowPrecisionWeights' cast would make them; a skipped step writes none.
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(8);
  std::vector<torch::Tensor> params{torch::randn({16, 8, 3, 3}, cuda).contiguous(at::MemoryFormat::ChannelsLast),
                                    torch::randn({10, 64}, cuda), torch::randn({64}, cuda)};
  std::vector<torch::Tensor> copies{torch::full_like(params[0], 3.0, torch::kHalf),
                                    torch::full_like(params[1], 3.0, torch::kBFloat16), torch::Tensor()};
  std::vector<torch::Tensor> buffers, grads;
  for (const torch::Tensor& param : params) {
    buffers.push_back(torch::zeros_like(param));
    grads.push_back(torch::randn_like(param));
  }
  const torch::Tensor lr = torch::full({}, 0.1, cuda);
  const int64_t version_before = params[0]._version();
  for (int step = 0; step < 3; ++step) {
    const bool skipped = step == 1;
    if (skipped)
      for (size_t i = 0; i < 2; ++i) copies[i].fill_(3.0);
    const torch::Tensor grad_scale = torch::full({1}, 1.0, cuda);
    const torch::Tensor found_inf = torch::full({1}, skipped ? 1.0 : 0.0, cuda);
    ops::sgd_step(ops::SgdBackend::ltrain, params, grads, buffers, {5e-4, 5e-4, 0.0}, 0.9, false, lr, grad_scale,
                  found_inf, copies);
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE(::testing::Message() << "step " << step << ", parameter " << i);
      if (skipped) EXPECT_TRUE(torch::all(copies[i] == 3.0).item<bool>());
      else EXPECT_TRUE(torch::equal(copies[i], params[i].to(copies[i].scalar_type())));
    }
  }
  EXPECT_EQ(params[0]._version(), version_before + 3);
  EXPECT_THROW(ops::sgd_step(ops::SgdBackend::ltrain, params, grads, buffers, {0.0, 0.0, 0.0}, 0.9, false, lr, {}, {},
                             {copies[0].contiguous(), copies[1], copies[2]}),
               std::logic_error);  // a copy in another memory order than its parameter
}

TEST(GradientKernels, SgdTakesTheSameStepWhereverItsTensorsLieInMemory_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_gradient_kernels_fit(torch::kCUDA));
  // The kernel moves aligned tensors 4 elements at a time and others one at a time: a step on
  // tensors one element into their storage (no longer aligned) must give the same bits. The sizes
  // end blocks and vector groups part way, with and without a momentum buffer and a copy.
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(9);
  for (const int64_t size : {int64_t{2048 * 3 + 1027}, int64_t{5}, int64_t{4096}}) {
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kHalf, torch::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << size << " elements, " << dtype);
      const torch::Tensor initial = torch::randn({size}, cuda), gradient = (torch::randn({size}, cuda) * 64).to(dtype);
      auto step = [&](int64_t offset, bool momentum) {
        // Each tensor a view `offset` elements into a storage of its own.
        auto placed = [&](const torch::Tensor& t) {
          torch::Tensor storage = torch::zeros({size + offset}, t.options());
          storage.narrow(0, offset, size).copy_(t);
          return storage.narrow(0, offset, size);
        };
        std::vector<torch::Tensor> params{placed(initial)}, buffers;
        if (momentum) buffers.push_back(placed(torch::zeros_like(initial)));
        std::vector<torch::Tensor> copies{placed(torch::zeros({size}, cuda.dtype(torch::kHalf)))};
        const torch::Tensor lr = torch::full({}, 0.1, cuda), grad_scale = torch::full({1}, 64.0, cuda);
        for (int k = 0; k < 2; ++k)
          ops::sgd_step(ops::SgdBackend::ltrain, params, {placed(gradient)}, buffers, {5e-4}, momentum ? 0.9 : 0.0,
                        true, lr, grad_scale, torch::zeros({1}, cuda), copies);
        return std::vector<torch::Tensor>{params[0].clone(), momentum ? buffers[0].clone() : torch::Tensor(),
                                          copies[0].clone()};
      };
      for (const bool momentum : {true, false}) {
        const std::vector<torch::Tensor> aligned = step(0, momentum), unaligned = step(1, momentum);
        EXPECT_TRUE(torch::equal(aligned[0], unaligned[0])) << "momentum " << momentum;
        if (momentum) {
          EXPECT_TRUE(torch::equal(aligned[1], unaligned[1]));
        }
        EXPECT_TRUE(torch::equal(aligned[2], unaligned[2]));
        EXPECT_TRUE(torch::equal(aligned[2], aligned[0].to(torch::kHalf)));
        EXPECT_FALSE(torch::equal(aligned[0], initial));
      }
    }
  }
}

TEST(SgdStep, ThePortableStepUnscalesAndSkipsWhereTheScalerFoundInf) {
  // p = [1, 2], scaled gradients [4, 8] at scale 4, weight decay 0.5, momentum 0.9 from a zero
  // buffer, lr 0.1: d = g / 4 + 0.5 p = [1.5, 3], the buffer becomes d, p - 0.1 d = [0.85, 1.7].
  const std::vector<torch::Tensor> params{torch::tensor({1.0f, 2.0f})}, buffers{torch::zeros({2})};
  const std::vector<torch::Tensor> gradients{torch::tensor({4.0f, 8.0f})};
  const torch::Tensor lr = torch::full({}, 0.1), grad_scale = torch::full({1}, 4.0);
  ops::sgd_step(ops::SgdBackend::portable, params, gradients, buffers, {0.5}, 0.9, false, lr, grad_scale,
                torch::zeros({1}));
  EXPECT_TRUE(torch::allclose(params[0], torch::tensor({0.85f, 1.7f}))) << params[0];
  EXPECT_TRUE(torch::allclose(buffers[0], torch::tensor({1.5f, 3.0f}))) << buffers[0];
  // found_inf set: neither the parameter nor its buffer moves.
  const torch::Tensor before = params[0].clone(), buffer_before = buffers[0].clone();
  ops::sgd_step(ops::SgdBackend::portable, params, gradients, buffers, {0.5}, 0.9, false, lr, grad_scale,
                torch::ones({1}));
  EXPECT_TRUE(torch::equal(params[0], before));
  EXPECT_TRUE(torch::equal(buffers[0], buffer_before));
  // Only ltrain's kernel writes low-precision copies of the weights.
  EXPECT_THROW(ops::sgd_step(ops::SgdBackend::portable, params, gradients, buffers, {0.5}, 0.9, false, lr, {}, {},
                             {params[0].to(torch::kBFloat16)}),
               std::logic_error);
}

TEST(SgdStep, EveryBackendTakesTheSameStep_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // Weight decays in two runs, as the optimizer's two groups hand them over: LibTorch's kernel
  // takes one weight decay a launch.
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(11);
  const std::vector<std::vector<int64_t>> shapes{{16, 8, 3, 3}, {10, 16}, {16}, {10}};
  const std::vector<double> weight_decays{5e-4, 5e-4, 0.0, 0.0};
  std::vector<torch::Tensor> initial, gradients;
  for (const auto& shape : shapes) {
    initial.push_back(torch::randn(shape, cuda));
    gradients.push_back(torch::randn(shape, cuda) * 256);
  }
  const auto steps = [&](ops::SgdBackend backend) {
    std::vector<torch::Tensor> params, buffers;
    for (const torch::Tensor& value : initial) {
      params.push_back(value.clone());
      buffers.push_back(torch::zeros_like(value));
    }
    const torch::Tensor lr = torch::full({}, 0.1, cuda), grad_scale = torch::full({1}, 256.0, cuda);
    for (int step = 0; step < 3; ++step) {
      // Each step's own gradients, as each backward pass makes them: LibTorch's kernel unscales the
      // gradients it is given in place.
      std::vector<torch::Tensor> step_gradients;
      for (const torch::Tensor& gradient : gradients) step_gradients.push_back(gradient.clone());
      ops::sgd_step(backend, params, step_gradients, buffers, weight_decays, 0.9, true, lr, grad_scale,
                    torch::zeros({1}, cuda));
    }
    return params;
  };
  const std::vector<torch::Tensor> portable = steps(ops::SgdBackend::portable);
  std::vector<ops::SgdBackend> others;
  if (ops::ltrain_gradient_kernels_fit(torch::kCUDA).runs) others.push_back(ops::SgdBackend::ltrain);
  if (compat::has_fused_optimizers()) others.push_back(ops::SgdBackend::libtorch);
  for (ops::SgdBackend backend : others) {
    const std::vector<torch::Tensor> fused = steps(backend);
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(torch::allclose(fused[i], portable[i], 1e-5, 1e-6)) << ops::name_of(backend) << ", parameter " << i;
  }
}

TEST(InfCheck, FindsInfAndNaNWithoutTouchingTheGradients) {
  const std::vector<torch::Tensor> finite{torch::tensor({1.0f, -2.0f}), torch::tensor({3.0f})};
  const torch::Tensor found_inf = torch::ones({1});  // a previous step's answer
  ops::find_inf(finite, found_inf);
  EXPECT_EQ(found_inf.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(finite[0], torch::tensor({1.0f, -2.0f})));
  for (const float bad : {INFINITY, -INFINITY, NAN}) {
    const std::vector<torch::Tensor> gradients{torch::tensor({1.0f, 2.0f}), torch::tensor({bad})};
    ops::find_inf(gradients, found_inf);
    EXPECT_EQ(found_inf.item<float>(), 1.0f) << bad;
  }
}

TEST(InfCheck, UnscaleMultipliesEveryGradientAndFindsInf) {
  const std::vector<torch::Tensor> gradients{torch::tensor({4.0f, -8.0f}), torch::tensor({2.0f})};
  const torch::Tensor found_inf = torch::ones({1});
  ops::unscale_and_find_inf(gradients, torch::full({1}, 0.25f), found_inf);
  EXPECT_EQ(found_inf.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(gradients[0], torch::tensor({1.0f, -2.0f})));
  EXPECT_TRUE(torch::equal(gradients[1], torch::tensor({0.5f})));
  const std::vector<torch::Tensor> with_nan{torch::tensor({NAN})};
  ops::unscale_and_find_inf(with_nan, torch::full({1}, 0.25f), found_inf);
  EXPECT_EQ(found_inf.item<float>(), 1.0f);
}

TEST(InfCheck, ReadsMixedPrecisionGradientsOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kHalf, torch::kBFloat16}) {
    std::vector<torch::Tensor> gradients{torch::randn({64, 3, 3, 3}, cuda).to(torch::kHalf),
                                         torch::randn({1000}, cuda).to(torch::kBFloat16), torch::randn({7}, cuda)};
    const torch::Tensor found_inf = torch::ones({1}, cuda);
    ops::find_inf(gradients, found_inf);
    EXPECT_EQ(found_inf.item<float>(), 0.0f) << dtype;
    gradients.push_back(torch::full({5}, NAN, cuda).to(dtype));
    ops::find_inf(gradients, found_inf);
    EXPECT_EQ(found_inf.item<float>(), 1.0f) << dtype;
  }
}

// ---- Which backend runs where -------------------------------------------------------------------

/// The names of the autograd nodes that produced `tensor`.
std::set<std::string> node_names(const torch::Tensor& tensor) {
  std::set<std::string> names;
  std::set<const torch::autograd::Node*> seen;
  std::vector<const torch::autograd::Node*> pending{tensor.grad_fn().get()};
  while (!pending.empty()) {
    const torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    names.insert(node->name());
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return names;
}

TEST(Ops, TheModelAndTheOptimizerRunLtrainKernelsExactlyWhereTheyFit_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // What each family's fit says decides the backend: ltrain's kernels where they run (every GPU of a
  // default build), LibTorch's and cuDNN's where they do not (a build without code for the GPU).
  // Deterministic cuDNN would turn ltrain's BatchNorm off: an earlier test may have asked for it.
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  const torch::Device cuda(torch::kCUDA, 0);
  const auto loaded = testing::config_from({"run.device=cuda", "model.arch=resnet18", "model.width=16",
                                            "model.channels_last=true", "model.cudnn_batch_norm=false",
                                            "precision.mode=fp16", "optim.fused=true"});
  models::ResNet model = engine::build_model(loaded, cuda);
  const torch::Tensor images = torch::randn({8, 3, 32, 32}, cuda).contiguous(torch::MemoryFormat::ChannelsLast);
  std::set<std::string> nodes;
  {
    const amp::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
    nodes = node_names(model->forward(images));
  }
  auto ran = [&](const std::string& part) {
    for (const std::string& name : nodes)
      if (name.find(part) != std::string::npos) return true;
    return false;
  };
  EXPECT_EQ(ran("LtrainBatchNorm"), ops::ltrain_batch_norm_fit(cuda).runs);
  EXPECT_EQ(ran("LtrainMaxPool"), ops::ltrain_max_pool_fit(cuda).runs);
  EXPECT_TRUE(ran("CudnnBatchNorm") || ran("NativeBatchNorm") || ran("LtrainBatchNorm"));
  const auto optimizer =
      optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*model));
  EXPECT_EQ(optimizer->takes_low_precision_gradients(), ops::ltrain_gradient_kernels_fit(cuda).runs);
  // LibTorch's fused SGD where ltrain's kernel does not run.
  EXPECT_EQ(optimizer->fused(), ops::ltrain_gradient_kernels_fit(cuda).runs || compat::has_fused_optimizers());
  // A kernel family that does not run says why.
  for (const device::KernelFit& fit :
       {ops::ltrain_batch_norm_fit(cuda), ops::ltrain_max_pool_fit(cuda), ops::ltrain_gradient_kernels_fit(cuda),
        ops::ltrain_cross_entropy_fit(cuda)})
    EXPECT_EQ(fit.runs, fit.reason.empty()) << fit.reason;
}

TEST(Convolution, IsTorchsConvolutionWhereNoOtherBackendTakesIt) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({2, 8, 9, 9}, torch::requires_grad());
  const torch::Tensor weight = torch::randn({16, 4, 3, 3}, torch::requires_grad());
  const torch::Tensor grad_y = torch::randn({2, 16, 5, 5});
  const torch::Tensor y_expected = torch::conv2d(x, weight, {}, /*stride=*/2, /*padding=*/1, /*dilation=*/1, /*groups=*/2);
  const torch::autograd::variable_list grads_expected = torch::autograd::grad({y_expected}, {x, weight}, {grad_y});
  // On the CPU the weight-gradient branch is not taken; the statistics need ltrain's fused kernel.
  ops::ConvolutionBackends branched;
  branched.weight_gradient_branch = true;
  for (const ops::ConvolutionBackends& backends : {ops::ConvolutionBackends{}, branched}) {
    const ops::ConvWithStatistics out = ops::convolution(x, weight, {2, 1, 2}, backends, /*with_statistics=*/true);
    EXPECT_FALSE(out.statistics.defined());
    EXPECT_TRUE(torch::equal(out.y, y_expected));
    const torch::autograd::variable_list grads = torch::autograd::grad({out.y}, {x, weight}, {grad_y});
    EXPECT_TRUE(torch::equal(grads[0], grads_expected[0]));
    EXPECT_TRUE(torch::equal(grads[1], grads_expected[1]));
  }
}

TEST(Convolution, ImageChannelsPastTheWeightsAddNothing) {
  // Images padded from 3 to 4 channels, the fourth any finite values: the output and the weight's
  // gradient are those of the 3 channels alone, on either path; the padded channel's own data
  // gradient is no one's business, but the others' are the same.
  torch::manual_seed(4);
  const torch::Tensor images = torch::randn({2, 3, 12, 12});
  const torch::Tensor padded_data = torch::cat({images, torch::randn({2, 1, 12, 12}) * 100}, 1);
  const torch::Tensor weight_data = torch::randn({8, 3, 7, 7}) * 0.1;
  const torch::Tensor grad_y = torch::randn({2, 8, 6, 6});
  const torch::Tensor weight_one = weight_data.clone().requires_grad_(true);
  const torch::Tensor y_one = torch::conv2d(images, weight_one, {}, /*stride=*/2, /*padding=*/3);
  y_one.backward(grad_y);
  ops::ConvolutionBackends branched;
  branched.weight_gradient_branch = true;
  for (const ops::ConvolutionBackends& backends : {ops::ConvolutionBackends{}, branched}) {
    const torch::Tensor padded = padded_data.clone().requires_grad_(true);
    const torch::Tensor weight = weight_data.clone().requires_grad_(true);
    const torch::Tensor y = ops::convolution(padded, weight, {2, 3, 1}, backends).y;
    EXPECT_TRUE(torch::allclose(y, y_one, 1e-5, 1e-5));
    y.backward(grad_y);
    EXPECT_EQ(weight.grad().sizes(), weight.sizes());
    EXPECT_TRUE(torch::allclose(weight.grad(), weight_one.grad(), 1e-4, 1e-4));
    EXPECT_EQ(padded.grad().sizes(), padded.sizes());
  }
}

TEST(Convolution, ImageChannelsPastTheWeightsAddNothingOnTheBranch_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // The branched convolution pads the weight inside its autograd function and cuts its gradient
  // back on the branch: float64, so that cuDNN's kernels for 3 and 4 channels agree to rounding, in
  // either layout, the padded channel's values far from zero.
  const torch::Device device(torch::kCUDA);
  const auto f64 = torch::TensorOptions().device(device).dtype(torch::kDouble);
  torch::manual_seed(6);
  const torch::Tensor images = torch::randn({2, 3, 12, 12}, f64);
  const torch::Tensor padded_data = torch::cat({images, torch::randn({2, 1, 12, 12}, f64) * 100}, 1);
  const torch::Tensor weight_data = torch::randn({8, 3, 7, 7}, f64) * 0.1;
  const torch::Tensor grad_y = torch::randn({2, 8, 6, 6}, f64);
  const torch::Tensor weight_one = weight_data.clone().requires_grad_(true);
  const torch::Tensor y_one = torch::conv2d(images, weight_one, {}, /*stride=*/2, /*padding=*/3);
  y_one.backward(grad_y);
  ops::ConvolutionBackends branched;
  branched.weight_gradient_branch = true;
  for (const auto format : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast}) {
    const torch::Tensor padded = padded_data.clone(format).requires_grad_(true);
    const torch::Tensor weight = weight_data.clone(format).requires_grad_(true);
    const torch::Tensor y = ops::convolution(padded, weight, {2, 3, 1}, branched).y;
    EXPECT_TRUE(torch::allclose(y, y_one, 1e-10, 1e-10)) << format;
    y.backward(grad_y.contiguous(format));
    gpu::join_branch(device);  // the weight's gradient was queued on the branch
    ASSERT_TRUE(weight.grad().defined()) << format;
    EXPECT_EQ(weight.grad().sizes(), weight.sizes()) << format;
    EXPECT_TRUE(torch::allclose(weight.grad(), weight_one.grad(), 1e-10, 1e-10)) << format;
    EXPECT_EQ(padded.grad().sizes(), padded.sizes()) << format;
  }
}

TEST(Convolution, PaddedImagesMeetTheStemAsPreciselyAsTheirOwnChannels_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // cuDNN runs other kernels for the padded images' 4 (fp16) or 8 (bf16) channels than for 3: the
  // stem's output and weight gradient must be as close to the exact ones (float64, from the same
  // rounded numbers) as the 3-channel kernels' are, where the step picks its kernels (benchmark on).
  const testing::CudnnFlags fastest(/*deterministic=*/false, /*benchmark=*/true);
  const torch::Device device(torch::kCUDA);
  const auto last = torch::MemoryFormat::ChannelsLast;
  struct Stem {
    const char* name;
    int64_t kernel, stride, padding;
  };
  torch::manual_seed(7);
  for (const torch::ScalarType dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const Stem& stem : {Stem{"imagenet", 7, 2, 3}, Stem{"cifar", 3, 1, 1}}) {
      const auto options = torch::TensorOptions().device(device).dtype(dtype);
      const torch::Tensor images = torch::randn({64, 3, 32, 32}, options).contiguous(last);  // [B,3,H,W]
      const torch::Tensor weight_data =
          (torch::randn({64, 3, stem.kernel, stem.kernel}, options) * 0.1).contiguous(last);  // [64,3,k,k]
      const int64_t side = (32 + 2 * stem.padding - stem.kernel) / stem.stride + 1;
      const torch::Tensor grad_y = torch::randn({64, 64, side, side}, options).contiguous(last);
      const ops::ConvolutionParameters parameters{stem.stride, stem.padding, 1};

      const auto exact = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
      const torch::Tensor reference_weight = exact(weight_data).requires_grad_(true);
      const torch::Tensor reference_y =
          torch::conv2d(exact(images), reference_weight, {}, stem.stride, stem.padding);
      reference_y.backward(exact(grad_y));
      const auto error = [&](const torch::Tensor& t, const torch::Tensor& reference) {
        return (exact(t) - reference).norm().item<double>() / reference.norm().item<double>();
      };

      // The images as the step's graph holds them: the batch's channels, then zeros.
      const int64_t channels = ops::padded_image_channels(3, dtype, last, device);
      ASSERT_GT(channels, 3);
      const torch::Tensor padded = torch::empty({64, channels, 32, 32}, options.memory_format(last)).zero_();
      padded.narrow(1, 0, 3).copy_(images);
      std::vector<double> y_errors, gradient_errors;  // 3 channels, then padded
      for (const torch::Tensor& x : {images, padded}) {
        const torch::Tensor weight = weight_data.clone(last).requires_grad_(true);
        const torch::Tensor y = ops::convolution(x, weight, parameters, {}).y;
        y.backward(grad_y);
        y_errors.push_back(error(y, reference_y.detach()));
        gradient_errors.push_back(error(weight.grad(), reference_weight.grad()));
      }
      const std::string name = std::string(stem.name) + (dtype == torch::kHalf ? " fp16" : " bf16");
      // Each output's rounding to fp16/bf16 alone is about 3e-4 / 2e-3 of it: the references hold
      // if the 3-channel kernels come within a few times that, and the padded ones within 3 times
      // theirs (an accumulation in fp16/bf16 would be far more).
      const double few_roundings = dtype == torch::kHalf ? 1e-2 : 5e-2;
      EXPECT_LT(y_errors[0], few_roundings) << name;
      EXPECT_LT(gradient_errors[0], few_roundings) << name;
      EXPECT_LE(y_errors[1], 3.0 * y_errors[0] + 1e-6) << name;
      EXPECT_LE(gradient_errors[1], 3.0 * gradient_errors[0] + 1e-6) << name;
    }
  }
}

TEST(Convolution, ImagesArePaddedForCudnnOnlyWhereItsStemRunsFasterSo) {
  const torch::Device cuda(torch::kCUDA), cpu(torch::kCPU);
  const auto last = torch::MemoryFormat::ChannelsLast, first = torch::MemoryFormat::Contiguous;
  EXPECT_EQ(ops::padded_image_channels(3, torch::kHalf, last, cuda), 4);
  EXPECT_EQ(ops::padded_image_channels(3, torch::kBFloat16, last, cuda), 8);
  EXPECT_EQ(ops::padded_image_channels(3, torch::kFloat32, last, cuda), 3);  // not measured
  EXPECT_EQ(ops::padded_image_channels(3, torch::kHalf, first, cuda), 3);
  EXPECT_EQ(ops::padded_image_channels(3, torch::kHalf, last, cpu), 3);
  EXPECT_EQ(ops::padded_image_channels(1, torch::kHalf, last, cuda), 1);
}

TEST(Convolution, TheWeightGradientRunsOnTheBranchBesideTheDataGradient_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if LTRAIN_WITH_CUDA
  const testing::CudnnFlags repeatable(/*deterministic=*/true, /*benchmark=*/false);
  const torch::Device device(torch::kCUDA);
  const auto half = torch::TensorOptions().device(device).dtype(torch::kHalf);
  torch::manual_seed(5);
  auto channels_last = [](const torch::Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); };
  const torch::Tensor x_data = channels_last(torch::randn({8, 64, 16, 16}, half));     // [B,C,H,W] fp16
  const torch::Tensor weight_data = channels_last(torch::randn({64, 64, 3, 3}, half) * 0.05);
  const torch::Tensor grad_y = channels_last(torch::randn({8, 64, 16, 16}, half));

  const torch::Tensor x_one = x_data.clone().requires_grad_(true);
  const torch::Tensor weight_one = weight_data.clone().requires_grad_(true);
  torch::conv2d(x_one, weight_one, {}, 1, 1).backward(grad_y);

  const torch::Tensor x = x_data.clone().requires_grad_(true);
  const torch::Tensor weight = weight_data.clone().requires_grad_(true);
  ops::ConvolutionBackends branched;
  branched.weight_gradient_branch = true;
  // The branch is held up first: whatever the backward pass queues there waits behind it.
  gpu::fork_to_branch(device, [] { at::cuda::sleep(1LL << 29); }, {});
  const torch::Tensor y = ops::convolution(x, weight, {1, 1, 1}, branched).y;
  y.backward(grad_y);
  c10::cuda::getCurrentCUDAStream().synchronize();
  EXPECT_FALSE(gpu::branch_done(device)) << "the weight gradient ran on the backward pass's own stream";
  EXPECT_TRUE(torch::equal(x.grad(), x_one.grad()));

  gpu::join_branch(device);
  c10::cuda::getCurrentCUDAStream().synchronize();
  EXPECT_TRUE(gpu::branch_done(device));
  EXPECT_TRUE(torch::equal(y, torch::conv2d(x_one, weight_one, {}, 1, 1)));
  EXPECT_TRUE(torch::equal(weight.grad(), weight_one.grad()));
#endif
}

}  // namespace
}  // namespace ltrain
