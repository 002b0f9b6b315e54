// GPU-only behaviour, skipped where no CUDA device is usable (run on the GPU host).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ltrain/amp/autocast.h"
#include "ltrain/amp/grad_scaler.h"
#include "ltrain/amp/precision.h"
#include "ltrain/config/load.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/models/fused_batchnorm.h"
#include "ltrain/models/max_pool.h"
#include "ltrain/models/own_batchnorm.h"
#include "ltrain/models/resnet.h"
#include "ltrain/optim/gradient_kernels.h"
#include "support.h"

#if LTRAIN_WITH_CUDNN
#include <c10/cuda/CUDAStream.h>

#include "ltrain/kernels/conv_graph.h"
#endif

// Skips a test of ltrain's own kernels where they do not run (a build without an image for this GPU),
// saying why: the model and the optimizer then take LibTorch's paths, which other tests cover.
#define LTRAIN_REQUIRE_KERNELS(fit_expression)                                              \
  do {                                                                                      \
    LTRAIN_REQUIRE_CUDA();                                                                  \
    const ::ltrain::kernels::KernelFit fit_here = (fit_expression);                         \
    if (!fit_here.runs) GTEST_SKIP() << "the kernels do not run here: " << fit_here.reason; \
  } while (false)

namespace ltrain {
namespace {

config::LoadedConfig gpu_config(const std::vector<std::string>& extra) {
  return testing::config_from({"run.device=cuda", "model.arch=resnet18", "model.stem=cifar", "model.width=16",
                               "data.batch_size=32", "optim.lr=0.05"},
                              extra);
}

data::Batch gpu_batch(int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({size, 3, 32, 32}).cuda(), torch::randint(0, 10, {size}, torch::kInt64).cuda()};
}

/// Trains `steps` steps on one fixed batch; returns each step's loss.
std::vector<double> train_fixed_batch(const config::LoadedConfig& loaded, int steps) {
  engine::apply_runtime_settings(loaded.config);
  const torch::Device device = engine::resolve_device(loaded);
  models::ResNet model = engine::build_model(loaded, device);
  auto optimizer = optim::make_optimizer(loaded.config.optim, engine::named_parameters(*model));
  optimizer->set_lr(loaded.config.optim.lr);
  amp::GradScaler scaler(amp::scaler_options(loaded.config.precision), device);
  engine::TrainStep step(model, *optimizer, scaler, loaded.config);
  data::Batch batch = gpu_batch(loaded.config.data.batch_size, 1);
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    step.run(batch);
    losses.push_back(step.take_totals().mean_loss());
  }
  return losses;
}

double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, ((a[i] - b[i]).norm() / (b[i].norm() + 1e-12)).item<double>());
  return worst;
}

TEST(MixedPrecision, Fp16AndBf16LossesAreFiniteAndFall_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  for (const char* mode : {"fp16", "bf16"}) {
    const std::vector<double> losses = train_fixed_batch(gpu_config({std::string("precision.mode=") + mode}), 12);
    for (double loss : losses) EXPECT_TRUE(std::isfinite(loss)) << mode;
    EXPECT_LT(losses.back(), 0.5 * losses.front()) << mode;  // one batch is memorized quickly
  }
}

TEST(MixedPrecision, FusedAndPortableOptimizersAgree_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  if (!compat::has_fused_optimizers()) GTEST_SKIP() << "this LibTorch has no fused optimizers";
  // The same parameters and the same scaled gradients go through both paths; step 1 carries an
  // inf (found_inf = 1) that both must skip on the device. Only the update arithmetic differs,
  // so the weights and the optimizer state must agree to float32 rounding.
  // More parameters than one launch of ltrain's SGD kernel takes (64), one over many blocks.
  std::vector<std::vector<int64_t>> shapes{{16, 3, 3, 3}, {16}, {16}, {10, 16}, {10}, {300, 70}};
  for (int64_t i = 0; i < 70; ++i) shapes.push_back({i % 5 + 1, 3});
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(3);
  NamedTensors initial;
  for (size_t i = 0; i < shapes.size(); ++i) initial.emplace_back("p" + std::to_string(i), torch::randn(shapes[i], cuda));
  const double scale = 1024.0;
  std::vector<std::vector<torch::Tensor>> scaled_grads(4);  // per step, per parameter
  for (auto& grads : scaled_grads)
    for (const auto& shape : shapes) grads.push_back(torch::randn(shape, cuda) * scale);

  for (const char* name : {"sgd", "adamw"}) {
    config::OptimSection options;
    options.name = name == std::string("sgd") ? config::OptimizerKind::sgd : config::OptimizerKind::adamw;
    options.lr = 0.05;
    options.momentum = 0.9;
    options.nesterov = true;
    options.weight_decay = 5e-4;
    options.no_decay_norm_and_bias = true;
    auto run = [&](bool fused) {
      NamedTensors params;
      for (const auto& [key, tensor] : initial) params.emplace_back(key, tensor.clone().requires_grad_(true));
      options.fused = fused;
      auto optimizer = optim::make_optimizer(options, params);
      // SGD: ltrain's kernel where it runs on this GPU, else LibTorch's.
      EXPECT_EQ(optimizer->fused(), fused) << name;
      if (options.name == config::OptimizerKind::sgd && fused) {
        EXPECT_EQ(std::string(optimizer->step_kernel()), optim::gradient_kernels_fit(torch::kCUDA).runs
                                                             ? "fused (ltrain's SGD kernel)"
                                                             : "fused (LibTorch's SGD kernel)");
      }
      optimizer->set_lr(options.lr);
      const torch::Tensor grad_scale = torch::full({1}, scale, cuda);
      for (size_t step = 0; step < scaled_grads.size(); ++step) {
        for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = scaled_grads[step][i].clone();
        const torch::Tensor found_inf = torch::full({1}, step == 1 ? 1.0 : 0.0, cuda);
        optimizer->step({grad_scale, found_inf});
      }
      NamedTensors out = params;
      for (const auto& entry : optimizer->state()) out.push_back(entry);
      return out;
    };
    const NamedTensors fused = run(true), portable = run(false);
    ASSERT_EQ(fused.size(), portable.size()) << name;
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_EQ(fused[i].first, portable[i].first);
      const torch::Tensor a = fused[i].second.detach().to(torch::kFloat64).cpu();
      const torch::Tensor b = portable[i].second.detach().to(torch::kFloat64).cpu();
      EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6)) << name << " " << fused[i].first << ": max difference "
                                                    << (a - b).abs().max().item<double>();
    }
  }
}

TEST(MixedPrecision, SgdKernelReadsLowPrecisionGradientsAsTheirFloat32Values_CUDA) {
  LTRAIN_REQUIRE_KERNELS(optim::gradient_kernels_fit(torch::kCUDA));
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
      const amp::ScalerState scaler{torch::full({1}, 512.0, cuda), torch::zeros({1}, cuda)};
      for (int step = 0; step < 3; ++step)
        optim::sgd_step(params, grads, buffers, {5e-4, 0.0, 5e-4}, 0.9, true, lr, scaler);
      params.insert(params.end(), buffers.begin(), buffers.end());
      return params;
    };
    const std::vector<torch::Tensor> from_low = run(false), from_float32 = run(true);
    for (size_t i = 0; i < from_low.size(); ++i) EXPECT_TRUE(torch::equal(from_low[i], from_float32[i])) << i;
  }
}

TEST(MixedPrecision, SgdKernelPairsGradientAndParameterElementsWhateverTheirLayouts_CUDA) {
  LTRAIN_REQUIRE_KERNELS(optim::gradient_kernels_fit(torch::kCUDA));
  // channels_last parameters: a 3x3 convolution's weight, whose contiguous gradient is in another
  // order, and a 1x1 convolution's, whose contiguous gradient has other strides but the same
  // order. Either way a step equals the step from the gradient in the parameter's own layout.
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
        optim::sgd_step(params, {grad}, buffers, {5e-4}, 0.9, false, lr, amp::ScalerState{});
      return params[0];
    };
    EXPECT_TRUE(torch::equal(step_with(gradient), step_with(gradient.contiguous(at::MemoryFormat::ChannelsLast))));
    EXPECT_FALSE(torch::equal(step_with(gradient), initial));
  }
}

TEST(MixedPrecision, SgdKernelWritesEachParametersLowPrecisionCopyUnlessTheStepIsSkipped_CUDA) {
  LTRAIN_REQUIRE_KERNELS(optim::gradient_kernels_fit(torch::kCUDA));
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
    const amp::ScalerState scaler{torch::full({1}, 1.0, cuda), torch::full({1}, skipped ? 1.0 : 0.0, cuda)};
    optim::sgd_step(params, grads, buffers, {5e-4, 5e-4, 0.0}, 0.9, false, lr, scaler, copies);
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE(::testing::Message() << "step " << step << ", parameter " << i);
      if (skipped) EXPECT_TRUE(torch::all(copies[i] == 3.0).item<bool>());
      else EXPECT_TRUE(torch::equal(copies[i], params[i].to(copies[i].scalar_type())));
    }
  }
  EXPECT_EQ(params[0]._version(), version_before + 3);
  EXPECT_THROW(optim::sgd_step(params, grads, buffers, {0.0, 0.0, 0.0}, 0.9, false, lr, {},
                               {copies[0].contiguous(), copies[1], copies[2]}),
               std::logic_error);  // a copy in another memory order than its parameter
}

TEST(MixedPrecision, InfCheckReadsEveryDtypeAndChangesNoGradient_CUDA) {
  LTRAIN_REQUIRE_KERNELS(optim::gradient_kernels_fit(torch::kCUDA));
  // Float32, fp16 and bf16 gradients in one list, more of them than one launch takes (128).
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(6);
  std::vector<torch::Tensor> grads{torch::randn({5000}, cuda), torch::randn({3, 3}, cuda).to(torch::kHalf)};
  for (int i = 0; i < 130; ++i) grads.push_back(torch::randn({7}, cuda).to(torch::kBFloat16));
  // Over several blocks of 16-byte loads, and one not 16-byte aligned (read element by element).
  grads.push_back(torch::randn({40000}, cuda).to(torch::kHalf));
  grads.push_back(torch::randn({1001}, cuda).to(torch::kHalf).narrow(0, 1, 1000));
  amp::GradScalerOptions options;
  options.enabled = true;
  amp::GradScaler scaler(options, torch::kCUDA);
  auto found_after_check = [&]() {
    std::vector<torch::Tensor> before;
    for (const auto& grad : grads) before.push_back(grad.clone());
    scaler.check(grads);
    for (size_t i = 0; i < grads.size(); ++i) {  // equal_nan: a NaN left in place equals itself
      EXPECT_TRUE(torch::allclose(grads[i].to(torch::kFloat64), before[i].to(torch::kFloat64), 0.0, 0.0, true)) << i;
    }
    return scaler.step_state(/*gradients_unscaled=*/false).found_inf.item<double>();
  };
  EXPECT_EQ(found_after_check(), 0.0);
  grads[1][2][2] = std::numeric_limits<double>::infinity();  // the fp16 gradient's last element
  EXPECT_EQ(found_after_check(), 1.0);
  grads[1][2][2] = 0.0;
  EXPECT_EQ(found_after_check(), 0.0);  // each check starts from zero
  grads[131][6] = std::numeric_limits<double>::quiet_NaN();  // the last bf16 gradient, in the second launch
  EXPECT_EQ(found_after_check(), 1.0);
  grads[131][6] = 0.0;
  grads[0][4999] = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(found_after_check(), 1.0);
  grads[0][4999] = 0.0;
  grads[132][20001] = std::numeric_limits<double>::infinity();  // the second block, inside a vector
  EXPECT_EQ(found_after_check(), 1.0);
  grads[132][20001] = 0.0;
  grads[133][500] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(found_after_check(), 1.0);
  grads[133][500] = 0.0;
  EXPECT_EQ(found_after_check(), 0.0);
}

TEST(MixedPrecision, ScalerSkipsAndBacksOffOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const auto loaded = gpu_config({"precision.mode=fp16"});
  models::ResNet model = engine::build_model(loaded, torch::kCUDA);
  auto optimizer = optim::make_optimizer(loaded.config.optim, engine::named_parameters(*model));
  amp::GradScaler scaler(amp::scaler_options(loaded.config.precision), torch::kCUDA);
  engine::TrainStep step(model, *optimizer, scaler, loaded.config);
  data::Batch batch = gpu_batch(32, 2);
  batch.images[0][0][0][0] = std::numeric_limits<float>::infinity();
  const torch::Tensor before = model->parameters().front().detach().clone();
  step.run(batch);
  const engine::StepTotals totals = step.take_totals();
  EXPECT_EQ(totals.skipped_steps, 1);
  EXPECT_EQ(totals.loss_scale, 32768.0);
  EXPECT_TRUE(torch::equal(model->parameters().front().detach(), before));
}

TEST(ActivationCheckpointing, SameGradientsOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  auto gradients = [](const std::vector<std::string>& extra) {
    const auto loaded = gpu_config(extra);
    // Deterministic cuDNN: the same algorithms on both sides.
    const testing::CudnnFlags repeatable(/*deterministic=*/true, /*benchmark=*/false);
    models::ResNet model = engine::build_model(loaded, torch::kCUDA);
    const data::Batch batch = gpu_batch(16, 3);
    {
      const amp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, loaded.config.precision.mode ==
                                                                             config::PrecisionMode::bf16);
      engine::classification_loss(model->forward(batch.images), batch.labels, 0.0).backward();
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu().clone());
    return grads;
  };
  EXPECT_LT(max_relative_difference(gradients({"model.checkpoint_segments=4"}), gradients({})), 1e-4);
  EXPECT_LT(max_relative_difference(gradients({"model.checkpoint_segments=4", "precision.mode=bf16"}),
                                    gradients({"precision.mode=bf16"})),
            1e-2);
}

/// A training-mode BatchNorm over `channels` channels with weights away from 1 and 0, on the GPU.
models::BatchNorm2d gpu_batchnorm(int64_t channels) {
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

/// Which single-kernel BatchNorm a test calls.
enum class BatchNormPath { cudnn, own };

/// What one call of a single-kernel BatchNorm left: output, gradients and running statistics.
struct BatchNormResult {
  torch::Tensor y, grad_x, grad_residual, grad_weight, grad_bias, running_mean, running_var;
};

/// y = bn(x), relu(bn(x)) or relu(bn(x) + residual) on `path` (`relu` false on the cuDNN path runs
/// the separate operators, which that path leaves to them) or, with `reference`, on torch's
/// operators in float32; then y.backward(grad_y). The same seed gives every path the same inputs,
/// drawn in `dtype` and, for the reference, converted exactly. y is undefined where the path declined.
BatchNormResult run_batchnorm(BatchNormPath path, bool reference, torch::ScalarType dtype,
                              const std::vector<int64_t>& shape, bool relu, bool add_residual, double offset = 0.0) {
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  torch::manual_seed(5);
  const int64_t channels = shape[1];
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  auto draw = [&](double shift) { return (torch::randn(shape, options) + shift).contiguous(at::MemoryFormat::ChannelsLast); };
  torch::Tensor x = draw(offset);
  torch::Tensor residual = add_residual ? draw(0.0) : torch::Tensor();
  const torch::Tensor grad_y = draw(0.0);
  models::BatchNorm2d norm = gpu_batchnorm(channels);
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
    const models::BatchNormParameters parameters{norm->weight, norm->bias, norm->running_mean, norm->running_var,
                                                 models::BatchNorm2dImpl::kMomentum, models::BatchNorm2dImpl::kEps};
    y = path == BatchNormPath::own ? models::try_own_batchnorm(x, residual, relu, parameters)
                                   : models::try_fused_batchnorm_relu(x, residual, parameters);
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

double batchnorm_tolerance(torch::ScalarType dtype) { return dtype == torch::kHalf ? 5e-3 : 3e-2; }

TEST(FusedBatchNorm, MatchesFloat32OperatorsInValuesGradientsAndRunningStatistics_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  if (!models::fused_batchnorm_built()) GTEST_SKIP() << "this build has no cuDNN fused BatchNorm";
  // [16,64,8,8] channels_last: a ResNet-50 layer1 activation at batch 16.
  const std::vector<int64_t> shape{16, 64, 8, 8};
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const bool add_residual : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (add_residual ? " with residual" : ""));
      const BatchNormResult fused = run_batchnorm(BatchNormPath::cudnn, false, dtype, shape, true, add_residual);
      if (!fused.y.defined() && dtype == torch::kBFloat16) {
        std::cout << "cuDNN refuses the fused kernel in bf16 (the model runs three operators there)\n";
        continue;
      }
      ASSERT_TRUE(fused.y.defined()) << "cuDNN refused the fused kernel in fp16 NHWC";
      EXPECT_EQ(fused.y.scalar_type(), dtype);
      EXPECT_TRUE(fused.y.is_contiguous(at::MemoryFormat::ChannelsLast));
      expect_close(fused, run_batchnorm(BatchNormPath::cudnn, true, dtype, shape, true, add_residual),
                   batchnorm_tolerance(dtype));
    }
  }
}

TEST(OwnBatchNorm, MatchesFloat32OperatorsForEachActivationAndShape_CUDA) {
  LTRAIN_REQUIRE_KERNELS(models::own_batchnorm_fit(torch::kCUDA));
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
        const std::string reduction = models::own_batchnorm_reduction(
            torch::empty(shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype)), relu, add_residual);
        reductions.insert(reduction);
        SCOPED_TRACE(::testing::Message() << dtype << " " << c10::IntArrayRef(shape)
                                          << (relu ? add_residual ? " add+relu" : " relu" : " no activation") << ", "
                                          << reduction << " reduction");
        const BatchNormResult own = run_batchnorm(BatchNormPath::own, false, dtype, shape, relu, add_residual);
        ASSERT_TRUE(own.y.defined()) << "the kernels declined";
        EXPECT_EQ(own.y.scalar_type(), dtype);
        EXPECT_TRUE(own.y.is_contiguous(at::MemoryFormat::ChannelsLast));
        EXPECT_EQ(own.y.grad_fn()->name().find("OwnBatchNorm") != std::string::npos, true) << own.y.grad_fn()->name();
        expect_close(own, run_batchnorm(BatchNormPath::own, true, dtype, shape, relu, add_residual),
                     batchnorm_tolerance(dtype));
      }
    }
  }
  // Every way of combining the blocks' sums was checked (clusters need sm_90 code on a GPU with them).
  if (models::own_batchnorm_cluster_fit(torch::kCUDA).runs) {
    EXPECT_TRUE(reductions.count("cluster"));
  } else {
    EXPECT_FALSE(reductions.count("cluster"));
  }
  EXPECT_TRUE(reductions.count("grid"));
  EXPECT_TRUE(reductions.count("streaming"));
}

TEST(OwnBatchNorm, AddsTheSecondOutputsGradientAsAutogradWouldHaveAddedIt_CUDA) {
  LTRAIN_REQUIRE_KERNELS(models::own_batchnorm_fit(torch::kCUDA));
  // A residual block's output reaches the loss twice, through the second output or through y
  // itself: the kernel's sum of the two gradients must be the sum autograd makes, bit for bit
  // with a cluster reduction ({16,64,8,8}), to float rounding with the grid's atomics (in
  // registers, and streamed).
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 64, 8, 8}, std::vector<int64_t>{130, 64, 8, 8},
                                            std::vector<int64_t>{257, 512, 8, 8}}) {
    const std::string reduction = models::own_batchnorm_reduction(torch::empty(shape, options), true, true);
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << ", " << reduction << " reduction");
    torch::manual_seed(9);
    auto draw = [&] { return torch::randn(shape, options).contiguous(at::MemoryFormat::ChannelsLast); };
    const torch::Tensor x0 = draw(), residual0 = draw(), grad_first = draw(), grad_second = draw();
    models::BatchNorm2d norm = gpu_batchnorm(shape[1]);
    const models::BatchNormParameters parameters{norm->weight, norm->bias, norm->running_mean, norm->running_var,
                                                 models::BatchNorm2dImpl::kMomentum, models::BatchNorm2dImpl::kEps};
    // kBoth: through both outputs; kOnce: through y, their sum; kSecondOnly: y unused.
    enum Use { kBoth, kOnce, kSecondOnly };
    auto gradients = [&](Use use) {
      const torch::Tensor x = x0.clone().requires_grad_(true), residual = residual0.clone().requires_grad_(true);
      norm->weight.mutable_grad() = torch::Tensor();
      norm->bias.mutable_grad() = torch::Tensor();
      torch::Tensor second;
      const torch::Tensor y =
          models::try_own_batchnorm(x, residual, true, parameters, use == kOnce ? nullptr : &second);
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
    const torch::Tensor y = models::try_own_batchnorm(x0, {}, true, parameters, &untouched);
    EXPECT_TRUE(y.defined());
    EXPECT_FALSE(untouched.defined());
  }
}

TEST(OwnBatchNorm, KeepsTheSpreadOfOffsetChannelsAndLeavesNothingForTheNextCall_CUDA) {
  LTRAIN_REQUIRE_KERNELS(models::own_batchnorm_fit(torch::kCUDA));
  // Channels centred at 64 with unit spread: sums of squares taken around 0 would lose the
  // variance to float32 cancellation; the kernels sum around each channel's first value. One
  // shape for each reduction (1024 rows: one cluster; 8192: the grid; 66560: streamed).
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{64, 128, 4, 4}, std::vector<int64_t>{128, 128, 8, 8},
                                            std::vector<int64_t>{520, 128, 8, 16}}) {
    const std::string reduction =
        models::own_batchnorm_reduction(torch::empty(shape, torch::dtype(torch::kHalf).device(torch::kCUDA)), true, true);
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << ", " << reduction << " reduction");
    const BatchNormResult first = run_batchnorm(BatchNormPath::own, false, torch::kHalf, shape, true, true, 64.0);
    ASSERT_TRUE(first.y.defined());
    expect_close(first, run_batchnorm(BatchNormPath::own, true, torch::kHalf, shape, true, true, 64.0),
                 batchnorm_tolerance(torch::kHalf));
    // The grid's kernels add into per-channel sums that each launch zeroes for the next: a second
    // call that found them non-zero would be off by the first call's statistics. A cluster's sums
    // are added in a fixed order, so its second call repeats the first bit for bit.
    const BatchNormResult again = run_batchnorm(BatchNormPath::own, false, torch::kHalf, shape, true, true, 64.0);
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

TEST(OwnBatchNorm, DeclinesWhatTheKernelsDoNotTake_CUDA) {
  LTRAIN_REQUIRE_KERNELS(models::own_batchnorm_fit(torch::kCUDA));
  const testing::CudnnFlags repeatable_off(/*deterministic=*/false, /*benchmark=*/false);
  auto declined = [](const std::vector<int64_t>& shape, torch::ScalarType dtype, bool channels_last) {
    models::BatchNorm2d norm = gpu_batchnorm(shape[1]);
    torch::Tensor x = torch::randn(shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype));
    if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const torch::Tensor running_mean = norm->running_mean.clone();
    const torch::Tensor y = models::try_own_batchnorm(
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

/// sqrt(sum ||a_i - b_i||^2) / sqrt(sum ||b_i||^2): all of a model's gradients as one vector.
double overall_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double difference = 0.0, reference = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (a[i] - b[i]).square().sum().item<double>();
    reference += b[i].square().sum().item<double>();
  }
  return std::sqrt(difference / reference);
}

TEST(FusedBatchNorm, ResNetGradientsAreAsCloseToFloat32AsTheUnfusedModels_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // Which BatchNorm a model runs: ltrain's kernels, cuDNN's fused kernel, or three operators.
  enum class Norm { own, cudnn, separate };
  auto gradients = [](const std::string& precision, Norm norm) {
    // ResNet-18 at batch 64: a randomly initialized ResNet-50 at batch 16 is so ill-conditioned
    // that fp16's rounding alone moves its gradients by 60% of their norm, fused or not.
    const auto loaded = gpu_config({"model.channels_last=true", "precision.mode=" + precision,
                                    std::string("model.own_batchnorm=") + (norm == Norm::own ? "true" : "false"),
                                    std::string("model.fused_batchnorm=") + (norm == Norm::cudnn ? "true" : "false")});
    // Deterministic cuDNN everywhere, except for ltrain's kernels, which that flag turns off.
    const testing::CudnnFlags repeatable(/*deterministic=*/norm != Norm::own, /*benchmark=*/false);
    models::ResNet model = engine::build_model(loaded, torch::kCUDA);
    const data::Batch batch = gpu_batch(64, 3);
    const torch::Tensor images = batch.images.contiguous(at::MemoryFormat::ChannelsLast);
    {
      const amp::AutocastGuard autocast(torch::kCUDA, torch::kHalf, precision == "fp16");
      // The cifar stem ends in its BatchNorm-ReLU pair: the single kernel's node, or ReLU's.
      const torch::Tensor stem = model->forward_stem(images);
      const std::string stem_node = stem.grad_fn()->name();
      if (precision == "fp16") {
        const bool own_runs = models::own_batchnorm_fit(torch::kCUDA).runs;
        EXPECT_EQ(stem_node.find("OwnBatchNorm") != std::string::npos, norm == Norm::own && own_runs) << stem_node;
        EXPECT_EQ(stem_node.find("FusedBatchNormRelu") != std::string::npos, norm == Norm::cudnn) << stem_node;
      }
      engine::classification_loss(model->forward(images), batch.labels, 0.0).backward();
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu().to(torch::kFloat32).clone());
    return grads;
  };
  const auto reference = gradients("fp32", Norm::separate);
  const auto unfused = gradients("fp16", Norm::separate);
  const double unfused_error = overall_relative_difference(unfused, reference);
  EXPECT_LT(unfused_error, 0.2);  // a comparison between answers close to float32's
  std::vector<std::pair<std::string, Norm>> single_kernels{{"ltrain's kernels", Norm::own}};
  if (models::fused_batchnorm_built()) single_kernels.emplace_back("cuDNN's fused kernel", Norm::cudnn);
  for (const auto& [name, norm] : single_kernels) {
    const auto fused = gradients("fp16", norm);
    const double fused_error = overall_relative_difference(fused, reference);
    std::cout << "fp16 gradients against float32: " << name << " " << fused_error << " (worst tensor "
              << max_relative_difference(fused, reference) << "), three operators " << unfused_error
              << " (worst tensor " << max_relative_difference(unfused, reference) << "); the two apart "
              << overall_relative_difference(fused, unfused) << "\n";
    EXPECT_LT(fused_error, 1.5 * unfused_error + 1e-3) << name;
  }
}

TEST(MaxPool, OwnKernelsMatchAtenInValuesAndGradients_CUDA) {
  LTRAIN_REQUIRE_KERNELS(models::own_max_pool_fit(torch::kCUDA));
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
        ASSERT_TRUE(models::takes_own_max_pool(input, w.kernel, w.stride, w.padding));
        const torch::Tensor own_input = input.clone().requires_grad_();
        const torch::Tensor aten_input = input.clone().requires_grad_();
        const torch::Tensor own = models::max_pool2d(own_input, w.kernel, w.stride, w.padding);
        const torch::Tensor aten = torch::max_pool2d(aten_input, {w.kernel, w.kernel}, {w.stride, w.stride},
                                                     {w.padding, w.padding});
        ASSERT_EQ(own.sizes(), aten.sizes());
        EXPECT_TRUE(own.is_contiguous(torch::MemoryFormat::ChannelsLast));
        EXPECT_TRUE(torch::allclose(own, aten, 0.0, 0.0, /*equal_nan=*/true));
        const torch::Tensor grad =
            torch::randn(aten.sizes(), aten.options()).contiguous(torch::MemoryFormat::ChannelsLast);
        own.backward(grad);
        aten.backward(grad);
        // The same terms summed in float32 in the same order: equal up to the final rounding.
        const double tolerance = dtype == torch::kFloat32 ? 1e-6 : 1e-2;
        EXPECT_TRUE(torch::allclose(own_input.grad().to(torch::kFloat32), aten_input.grad().to(torch::kFloat32), 0.0,
                                    tolerance));
        EXPECT_EQ(own_input.grad().count_nonzero().item<int64_t>(), aten_input.grad().count_nonzero().item<int64_t>());
      }
    }
  }
}

#if LTRAIN_WITH_CUDNN
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
#endif

TEST(ConvGraph, EachPassAndFusionMatchesFloat32Operators_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if !LTRAIN_WITH_CUDNN
  GTEST_SKIP() << "this build has no cuDNN of its own";
#else
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
#endif
}

TEST(MaxPool, AtenTakesInputsTheKernelsDoNotFit_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Tensor nchw = torch::randn({2, 64, 8, 8}, torch::kCUDA);
  const torch::Tensor nhwc = nchw.contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(models::takes_own_max_pool(nchw, 3, 2, 1));
  EXPECT_EQ(models::takes_own_max_pool(nhwc, 3, 2, 1), models::own_max_pool_fit(torch::kCUDA).runs);
  EXPECT_FALSE(models::takes_own_max_pool(torch::randn({2, 6, 8, 8}, torch::kCUDA).contiguous(
                                              torch::MemoryFormat::ChannelsLast),
                                          3, 2, 1));  // 6 channels fill no 16-byte vector
  EXPECT_FALSE(models::takes_own_max_pool(nhwc.to(torch::kFloat64), 3, 2, 1));
  EXPECT_TRUE(torch::equal(models::max_pool2d(nhwc, 3, 2, 1, /*own_kernels=*/false),
                           torch::max_pool2d(nhwc, {3, 3}, {2, 2}, {1, 1})));
}

}  // namespace
}  // namespace ltrain
