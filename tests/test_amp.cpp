// Mixed precision and memory features on the CPU: GradScaler semantics, the autocast guard,
// gradient accumulation, activation checkpointing, clipping.
#include <algorithm>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/amp/autocast.h"
#include "ltrain/amp/grad_scaler.h"
#include "ltrain/amp/low_precision_weights.h"
#include "ltrain/config/load.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/ops/gradient_kernels.h"
#include "ltrain/optim/optimizer.h"
#include "support.h"

namespace ltrain {
namespace {

using testing::gpu_batch;
using testing::gpu_config;
using testing::train_fixed_batch;

optim::OptimizerOptions plain_sgd(double momentum) {
  optim::OptimizerOptions o = engine::optimizer_options(config::OptimSection{});
  o.momentum = momentum;
  o.weight_decay = 0.0;
  return o;
}

/// The precision section's GradScaler settings, switched on (as precision.mode fp16 does).
amp::GradScalerOptions enabled_scaler() {
  amp::GradScalerOptions o = engine::grad_scaler_options(config::PrecisionSection{});
  o.enabled = true;
  return o;
}

amp::GradScalerOptions scaler_options(double init, int64_t interval) {
  amp::GradScalerOptions o = enabled_scaler();
  o.init_scale = init;
  o.growth_interval = interval;
  return o;
}

/// One parameter vector p with loss (p * x).sum(): its gradient is x (times the scale).
struct LinearProblem {
  torch::Tensor p = torch::ones({4}).requires_grad_();
  NamedTensors named{{"p", p}};
  void backward(amp::GradScaler& scaler, const torch::Tensor& x) {
    if (p.grad().defined()) p.mutable_grad().zero_();
    scaler.backward((p * x).sum());
  }
};

double value(const torch::Tensor& t) { return t.item<double>(); }

TEST(GradScaler, FollowsPyTorchsGrowthBackoffAndSkipRules) {
  amp::GradScaler scaler(scaler_options(4.0, 3), torch::kCPU);
  LinearProblem problem;
  auto optimizer = optim::make_optimizer(plain_sgd(0.9), problem.named);
  optimizer->set_lr(0.5);
  const torch::Tensor x = torch::tensor({1.0f, -2.0f, 3.0f, 0.5f});

  auto step = [&](const torch::Tensor& input) {
    problem.backward(scaler, input);
    scaler.unscale(optimizer->gradients());
    optimizer->step(scaler.step_state(true));
    scaler.update();
  };

  // Two clean steps: unscaled gradients, no growth yet.
  step(x);
  EXPECT_TRUE(torch::allclose(problem.p.grad(), x));  // (scale 4 * x) / 4
  EXPECT_EQ(value(scaler.found_inf()), 0.0);
  step(x);
  EXPECT_EQ(value(scaler.scale()), 4.0);
  // The third clean step in a row doubles the scale.
  step(x);
  EXPECT_EQ(value(scaler.scale()), 8.0);

  // An inf gradient: the step changes nothing, the scale halves, the skip is counted.
  const torch::Tensor weights = problem.p.detach().clone();
  const torch::Tensor momentum = optimizer->state().at(0).second.clone();
  step(torch::tensor({1.0f, std::numeric_limits<float>::infinity(), 0.0f, 0.0f}));
  EXPECT_EQ(value(scaler.found_inf()), 1.0);
  EXPECT_TRUE(torch::equal(problem.p.detach(), weights));
  EXPECT_TRUE(torch::equal(optimizer->state().at(0).second, momentum));
  EXPECT_EQ(value(scaler.scale()), 4.0);
  EXPECT_EQ(value(scaler.skipped_steps()), 1);
  EXPECT_EQ(value(scaler.consecutive_skips()), 1);

  // NaN too; then the growth count restarts from zero after the bad steps.
  step(torch::tensor({std::nanf(""), 0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(value(scaler.scale()), 2.0);
  EXPECT_EQ(value(scaler.consecutive_skips()), 2);
  step(x);
  step(x);
  EXPECT_EQ(value(scaler.consecutive_skips()), 0);
  EXPECT_EQ(value(scaler.skipped_steps()), 2);
  EXPECT_EQ(value(scaler.scale()), 2.0);
  step(x);
  EXPECT_EQ(value(scaler.scale()), 4.0);
  EXPECT_FALSE(torch::equal(problem.p.detach(), weights));  // clean steps did move the weights
}

TEST(GradScaler, NeverGrowsToInfinity) {
  amp::GradScaler scaler(scaler_options(3e38, 1), torch::kCPU);
  LinearProblem problem;
  problem.backward(scaler, torch::full({4}, 1e-30f));
  scaler.unscale({problem.p.grad()});
  scaler.update();
  EXPECT_FLOAT_EQ(static_cast<float>(value(scaler.scale())), 3e38f);
}

TEST(GradScaler, ItsBackwardPassGivesTheGradientsOfTheScaledLossBitForBit) {
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({8, 5});
  const torch::Tensor w = torch::randn({5, 3});
  for (const bool enabled : {true, false}) {
    SCOPED_TRACE(enabled);
    amp::GradScalerOptions options = scaler_options(1536.0, 10);
    options.enabled = enabled;
    const amp::GradScaler scaler(options, torch::kCPU);
    const torch::Tensor by_scaler = w.clone().requires_grad_(), by_product = w.clone().requires_grad_();
    scaler.backward(torch::log_softmax(x.mm(by_scaler), 1).mean());
    torch::Tensor loss = torch::log_softmax(x.mm(by_product), 1).mean();
    if (enabled) loss = loss * scaler.scale();
    loss.sum().backward();
    EXPECT_TRUE(torch::equal(by_scaler.grad(), by_product.grad()));
  }
}

TEST(GradScaler, CheckOnlyLeavesGradientsScaled) {
  amp::GradScaler scaler(scaler_options(8.0, 100), torch::kCPU);
  LinearProblem problem;
  problem.backward(scaler, torch::ones({4}));
  scaler.check({problem.p.grad()});
  EXPECT_TRUE(torch::allclose(problem.p.grad(), torch::full({4}, 8.0f)));
  const amp::ScalerState state = scaler.step_state(/*gradients_unscaled=*/false);
  ASSERT_TRUE(state.grad_scale.defined());
  // The portable optimizer divides by grad_scale itself: the same step as with unscaled gradients.
  auto optimizer = optim::make_optimizer(plain_sgd(0.0), problem.named);
  optimizer->set_lr(0.1);
  optimizer->step(state);
  EXPECT_TRUE(torch::allclose(problem.p.detach(), torch::full({4}, 0.9f)));
}

TEST(GradScaler, StateRoundTrips) {
  amp::GradScaler scaler(scaler_options(16.0, 2), torch::kCPU);
  LinearProblem problem;
  for (int i = 0; i < 3; ++i) {
    problem.backward(scaler, torch::ones({4}));
    scaler.unscale({problem.p.grad()});
    scaler.update();
  }
  amp::GradScaler restored(scaler_options(65536.0, 2), torch::kCPU);
  restored.load_state(scaler.state());
  for (size_t i = 0; i < scaler.state().size(); ++i)
    EXPECT_TRUE(torch::equal(restored.state()[i].second, scaler.state()[i].second)) << scaler.state()[i].first;
  EXPECT_EQ(value(restored.scale()), 32.0);
  EXPECT_THROW(restored.load_state({{"scale", torch::ones({1})}}), DataError);
}

TEST(Autocast, GuardSetsAndRestoresStateEvenThroughExceptions) {
  const bool enabled_before = compat::autocast_enabled(torch::kCPU);
  const auto dtype_before = compat::autocast_dtype(torch::kCPU);
  ASSERT_FALSE(enabled_before);
  try {
    const amp::AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(compat::autocast_enabled(torch::kCPU));
    EXPECT_EQ(compat::autocast_dtype(torch::kCPU), torch::kBFloat16);
    EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kBFloat16);
    {
      const amp::AutocastGuard disabled(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
      EXPECT_TRUE(compat::autocast_enabled(torch::kCPU));  // a disabled guard changes nothing
    }
    throw std::runtime_error("escapes the guard");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(compat::autocast_enabled(torch::kCPU), enabled_before);
  EXPECT_EQ(compat::autocast_dtype(torch::kCPU), dtype_before);
  EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat32);
}

/// A tiny ResNet config on the CPU (BatchNorm included, as in real runs).
config::LoadedConfig tiny(const std::vector<std::string>& extra = {}) {
  return testing::config_from({"run.device=cpu", "model.arch=resnet18", "model.stem=cifar", "model.width=4",
                               "optim.weight_decay=0", "optim.momentum=0"},
                              extra);
}

data::Batch random_batch(int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({size, 3, 32, 32}), torch::randint(0, 10, {size}, torch::kInt64)};
}

std::vector<torch::Tensor> gradients_of(models::ResNet& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu().clone());
  return grads;
}

void expect_all_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double rtol,
                      double atol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, atol)) << "tensor " << i << " max diff "
                                                         << (a[i] - b[i]).abs().max().item<double>();
}

TEST(Accumulation, GradientIsTheMeanOfTheMicroBatchGradients) {
  const auto loaded = tiny({"optim.accumulation_steps=3", "data.batch_size=4"});
  const data::Batch batch = random_batch(12, 5);

  models::ResNet accumulated = engine::build_model(loaded, torch::kCPU);
  auto optimizer =
      optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*accumulated));
  amp::GradScaler scaler(engine::grad_scaler_options(loaded.config.precision), torch::kCPU);
  engine::TrainStep step(accumulated, *optimizer, scaler, loaded.config);
  step.run(batch);  // the step moves the weights; the accumulated gradients stay in .grad

  models::ResNet one_by_one = engine::build_model(loaded, torch::kCPU);
  std::vector<torch::Tensor> mean;
  for (int64_t k = 0; k < 3; ++k) {
    one_by_one->zero_grad();
    engine::classification_loss(one_by_one->forward(batch.images.slice(0, 4 * k, 4 * k + 4)),
                                batch.labels.slice(0, 4 * k, 4 * k + 4), 0.0)
        .backward();
    const auto grads = gradients_of(one_by_one);
    if (mean.empty()) mean = grads;
    else for (size_t i = 0; i < grads.size(); ++i) mean[i] += grads[i];
  }
  for (auto& g : mean) g /= 3.0;
  expect_all_close(gradients_of(accumulated), mean, 1e-4, 1e-6);
  EXPECT_EQ(step.take_totals().images, 12);
}

/// Gradients and BatchNorm buffers after one forward/backward of `loaded`'s model.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> one_backward(const config::LoadedConfig& loaded,
                                                                               bool bf16_autocast) {
  models::ResNet model = engine::build_model(loaded, torch::kCPU);
  const data::Batch batch = random_batch(6, 9);
  {
    const amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16_autocast);
    engine::classification_loss(model->forward(batch.images), batch.labels, 0.0).backward();
  }
  std::vector<torch::Tensor> buffers;
  for (const auto& b : model->buffers()) buffers.push_back(b.clone());
  return {gradients_of(model), buffers};
}

TEST(ActivationCheckpointing, SameGradientsAndRunningStatistics) {
  const auto [grads, buffers] = one_backward(tiny(), false);
  for (int segments : {2, 4, 8}) {
    const auto [cgrads, cbuffers] = one_backward(tiny({"model.checkpoint_segments=" + std::to_string(segments)}), false);
    expect_all_close(cgrads, grads, 1e-5, 1e-7);
    expect_all_close(cbuffers, buffers, 0.0, 0.0);  // updated once, not twice
  }
}

TEST(ActivationCheckpointing, RecomputesUnderTheForwardsAutocastState) {
  const auto [grads, buffers] = one_backward(tiny(), true);
  const auto [cgrads, cbuffers] = one_backward(tiny({"model.checkpoint_segments=4"}), true);
  // bf16 recomputed in fp32 would differ by ~1e-2; the same bf16 ops agree far closer.
  expect_all_close(cgrads, grads, 1e-3, 1e-5);
  expect_all_close(cbuffers, buffers, 0.0, 0.0);
}

TEST(ActivationCheckpointing, SplitsLikeCheckpointSequential) {
  config::ModelSection options;
  options.width = 4;
  models::ResNet model(engine::resnet_options(options));  // resnet50: 16 blocks
  const auto segments = models::split_into_segments(model->blocks(), 4);
  ASSERT_EQ(segments.size(), 4u);
  for (const auto& segment : segments) EXPECT_EQ(segment.size(), 4u);
  const auto uneven = models::split_into_segments(model->blocks(), 3);  // 5 + 5 + the remaining 6
  ASSERT_EQ(uneven.size(), 3u);
  EXPECT_EQ(uneven[2].size(), 6u);
}

/// Two micro-batches under autocast to `dtype`: through the low-precision copies, the float32 gradients must be
/// autocast's own (float32 sums of the same low-precision gradients), and the layers must get
/// their float32 weights back afterwards.
void expect_copies_give_autocasts_gradients(const config::LoadedConfig& loaded, torch::ScalarType dtype,
                                             double tolerance) {
  const torch::Device device = engine::resolve_device(loaded);
  engine::apply_runtime_settings(loaded.config);
  data::Batch batch = random_batch(8, 11);
  batch = {batch.images.to(device).contiguous(engine::memory_format(loaded.config)), batch.labels.to(device)};
  auto backward = [&](models::ResNet& model, int64_t k) {
    const amp::AutocastGuard autocast(device.type(), dtype, true);
    engine::classification_loss(model->forward(batch.images.slice(0, 4 * k, 4 * k + 4)),
                                batch.labels.slice(0, 4 * k, 4 * k + 4), 0.0)
        .backward();
  };
  models::ResNet reference = engine::build_model(loaded, device);
  for (int64_t k = 0; k < 2; ++k) backward(reference, k);

  models::ResNet with_copies = engine::build_model(loaded, device);
  amp::LowPrecisionWeights weights(*with_copies, dtype);
  size_t convolutions = 0;
  for (const auto& module : with_copies->modules(false)) convolutions += module->as<torch::nn::Conv2d>() ? 1 : 0;
  EXPECT_EQ(weights.size(), convolutions + 2);  // every conv weight, the fc's weight and bias
  const auto modules = with_copies->named_modules();
  const torch::Tensor& conv1_weight = modules["conv1"]->as<torch::nn::Conv2d>()->weight;  // what forward reads
  const torch::Tensor& fc_bias = modules["fc"]->as<torch::nn::Linear>()->bias;
  {
    const amp::LowPrecisionWeights::InUse in_use(weights);
    EXPECT_EQ(conv1_weight.scalar_type(), dtype);
    EXPECT_EQ(fc_bias.scalar_type(), dtype);
    for (int64_t k = 0; k < 2; ++k) {
      backward(with_copies, k);
      weights.collect_gradients(/*first_micro_batch=*/k == 0);
    }
  }
  const auto parameters = with_copies->named_parameters();
  EXPECT_TRUE(conv1_weight.is_same(parameters["conv1.weight"]));
  EXPECT_TRUE(fc_bias.is_same(parameters["fc.bias"]));
  for (const auto& p : with_copies->parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
  expect_all_close(gradients_of(with_copies), gradients_of(reference), tolerance, tolerance);
}

TEST(LowPrecisionWeights, SameGradientsAsAutocastsOwnCasts) {
  expect_copies_give_autocasts_gradients(tiny(), torch::kBFloat16, 0.0);
}

TEST(LowPrecisionWeights, SameGradientsAsAutocastsOwnCastsOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // fp16, channels_last (the multi-tensor copies need equal strides), deterministic cuDNN so that
  // both runs pick the same algorithms.
  expect_copies_give_autocasts_gradients(
      tiny({"run.device=cuda", "model.channels_last=true", "precision.deterministic=true"}), torch::kFloat16, 1e-6);
}

TEST(LowPrecisionWeights, SkipsTheCastOnlyWhileTheOptimizerKeepsTheCopiesAndNoWeightChanged) {
  const config::LoadedConfig loaded = tiny();
  models::ResNet model = engine::build_model(loaded, torch::kCPU);
  amp::LowPrecisionWeights weights(*model, torch::kBFloat16);
  torch::Tensor master = model->named_parameters()["conv1.weight"];
  const torch::Tensor copy = weights.copy_of(master);
  ASSERT_TRUE(copy.defined());
  torch::NoGradGuard no_grad;
  auto copy_is_cast_of_master = [&] { return torch::equal(copy, master.to(torch::kBFloat16)); };

  { const amp::LowPrecisionWeights::InUse in_use(weights); }
  EXPECT_TRUE(copy_is_cast_of_master());
  // Until the optimizer is said to write the copies, every InUse casts.
  copy.fill_(7.0);
  weights.note_copies_written();
  { const amp::LowPrecisionWeights::InUse in_use(weights); }
  EXPECT_TRUE(copy_is_cast_of_master());

  weights.set_copies_written_by_optimizer(true);
  // As if the optimizer had written both: the next InUse must leave the copy alone (the
  // marker would otherwise be overwritten by the cast).
  copy.fill_(7.0);
  weights.note_copies_written();
  { const amp::LowPrecisionWeights::InUse in_use(weights); }
  EXPECT_TRUE(torch::all(copy == 7.0).item<bool>());

  master.mul_(2.0);  // an in-place change: a checkpoint load, a weight average swapped in
  weights.refresh();
  EXPECT_TRUE(copy_is_cast_of_master());

  copy.fill_(7.0);
  weights.note_copies_written();
  master.set_data(master.clone() + 1.0);  // new storage, no in-place operator
  weights.refresh();
  EXPECT_TRUE(copy_is_cast_of_master());
}

TEST(LowPrecisionWeights, CopiesAndTheirGradientsFollowTheGivenParameterOrder) {
  const config::LoadedConfig loaded = tiny();
  models::ResNet model = engine::build_model(loaded, torch::kCPU);
  std::vector<torch::Tensor> order = model->parameters();
  std::reverse(order.begin(), order.end());  // fc.bias first: any order the optimizer has
  amp::LowPrecisionWeights weights(*model, torch::kBFloat16, order);
  ASSERT_EQ(weights.copies().size(), order.size());
  size_t with_copy = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const torch::Tensor& copy = weights.copies()[i];
    EXPECT_EQ(copy.defined(), weights.copy_of(order[i]).defined());
    if (!copy.defined()) {
      EXPECT_EQ(order[i].dim(), 1);  // BatchNorm weights and biases have none
      continue;
    }
    ++with_copy;
    EXPECT_TRUE(copy.is_same(weights.copy_of(order[i])));
    EXPECT_EQ(copy.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(copy.sizes(), order[i].sizes());
  }
  EXPECT_EQ(with_copy, weights.size());

  {
    const amp::LowPrecisionWeights::InUse in_use(weights);
    const amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    model->forward(torch::randn({2, 3, 32, 32})).sum().backward();
  }
  const std::vector<torch::Tensor> gradients = weights.take_copy_gradients();
  ASSERT_EQ(gradients.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const bool has_copy = weights.copies()[i].defined();
    EXPECT_EQ(gradients[i].scalar_type(), has_copy ? torch::kBFloat16 : torch::kFloat32) << i;
    EXPECT_EQ(gradients[i].sizes(), order[i].sizes()) << i;
    // Moved out: the next backward pass writes fresh gradients instead of adding to these.
    EXPECT_FALSE((has_copy ? weights.copies()[i] : order[i]).grad().defined()) << i;
  }
  EXPECT_GT(gradients.front().abs().sum().item<double>(), 0.0);  // fc.bias takes a gradient
}

TEST(RuntimeSettings, PrecisionSectionReachesCudnnAndTf32Switches) {
  // The process-wide switches that PyTorch users set through torch.backends.*; restored after.
  at::Context& context = at::globalContext();
  const bool benchmark = context.benchmarkCuDNN();
  const int limit = context.benchmarkLimitCuDNN();
  const bool deterministic = context.deterministicCuDNN();
  const bool tf32_matmul = context.allowTF32CuBLAS();
  const bool tf32_convolutions = context.allowTF32CuDNN();
  config::RunConfig config;
  config.run.device = "cpu";
  config.precision.mode = config::PrecisionMode::tf32;
  config.precision.cudnn_benchmark = true;
  config.precision.cudnn_benchmark_limit = 0;
  engine::apply_runtime_settings(config);
  EXPECT_TRUE(context.benchmarkCuDNN());
  EXPECT_EQ(context.benchmarkLimitCuDNN(), 0);
  EXPECT_TRUE(context.allowTF32CuBLAS());
  config.precision.mode = config::PrecisionMode::fp32;
  config.precision.cudnn_benchmark = false;
  config.precision.cudnn_benchmark_limit = 3;
  engine::apply_runtime_settings(config);
  EXPECT_FALSE(context.benchmarkCuDNN());
  EXPECT_EQ(context.benchmarkLimitCuDNN(), 3);
  EXPECT_FALSE(context.allowTF32CuBLAS());
  compat::set_cudnn(benchmark, deterministic, limit);
  compat::set_tf32(tf32_matmul, tf32_convolutions);
}

TEST(Clipping, UnscalesBeforeClipping) {
  // The same step with and without a loss scale of 1024 gives the same weights only if the
  // gradients are unscaled before their norm is clipped.
  auto run = [](bool with_scaler) {
    const auto loaded = tiny({"optim.clip_grad_norm=0.5", "optim.lr=0.1", "data.batch_size=6"});
    models::ResNet model = engine::build_model(loaded, torch::kCPU);
    auto optimizer =
        optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*model));
    optimizer->set_lr(0.1);
    amp::GradScalerOptions options = scaler_options(1024.0, 2000);
    options.enabled = with_scaler;
    amp::GradScaler scaler(options, torch::kCPU);
    engine::TrainStep step(model, *optimizer, scaler, loaded.config);
    step.run(random_batch(6, 3));
    std::vector<torch::Tensor> weights;
    for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
    return weights;
  };
  expect_all_close(run(true), run(false), 1e-5, 1e-7);
}

TEST(Clipping, ScalesToTheMaximumNormOnlyWhenAbove) {
  std::vector<torch::Tensor> grads{torch::full({3}, 2.0f), torch::full({1}, 2.0f)};  // norm 4
  EXPECT_NEAR(engine::clip_grad_norm(grads, 1.0).item<double>(), 4.0, 1e-6);
  EXPECT_NEAR(torch::stack({grads[0].norm(), grads[1].norm()}).norm().item<double>(), 1.0, 1e-5);
  engine::clip_grad_norm(grads, 10.0);
  EXPECT_NEAR(torch::stack({grads[0].norm(), grads[1].norm()}).norm().item<double>(), 1.0, 1e-5);  // unchanged
}

TEST(Autocast, Fp16AndBf16LossesAreFiniteAndFallOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  for (const char* mode : {"fp16", "bf16"}) {
    const std::vector<double> losses = train_fixed_batch(gpu_config({std::string("precision.mode=") + mode}), 12);
    for (double loss : losses) EXPECT_TRUE(std::isfinite(loss)) << mode;
    EXPECT_LT(losses.back(), 0.5 * losses.front()) << mode;  // one batch is memorized quickly
  }
}

TEST(GradScaler, CheckOnTheGpuReadsEveryDtypeAndChangesNoGradient_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_gradient_kernels_fit(torch::kCUDA));
  // Float32, fp16 and bf16 gradients in one list, more of them than one launch takes (128).
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(6);
  std::vector<torch::Tensor> grads{torch::randn({5000}, cuda), torch::randn({3, 3}, cuda).to(torch::kHalf)};
  for (int i = 0; i < 130; ++i) grads.push_back(torch::randn({7}, cuda).to(torch::kBFloat16));
  // Over several blocks of 16-byte loads, and one not 16-byte aligned (read element by element).
  grads.push_back(torch::randn({40000}, cuda).to(torch::kHalf));
  grads.push_back(torch::randn({1001}, cuda).to(torch::kHalf).narrow(0, 1, 1000));
  amp::GradScaler scaler(enabled_scaler(), torch::kCUDA);
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

TEST(GradScaler, ItsUpdateOnTheGpuFollowsAtensRulesBitForBit_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_gradient_kernels_fit(torch::kCUDA));
  const auto on_gpu = torch::TensorOptions(torch::kCUDA);
  // Two scalers' tensors: ltrain's one-kernel update against ATen's update and operators, through
  // backoffs, growth, a growth that would overflow float32, and factors whose products round.
  const auto make = [&](double scale) {
    return ops::ScalerTensors{torch::full({1}, scale, on_gpu.dtype(torch::kFloat32)),
                              torch::zeros({1}, on_gpu.dtype(torch::kInt32)),
                              torch::zeros({1}, on_gpu.dtype(torch::kFloat32)),
                              torch::zeros({1}, on_gpu.dtype(torch::kInt64)),
                              torch::zeros({1}, on_gpu.dtype(torch::kInt64))};
  };
  for (const double start : {65536.0, 3e38}) {
    SCOPED_TRACE(start);
    const ops::ScalerTensors ltrain = make(start), aten = make(start);
    const std::vector<float> found = {0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
    for (size_t step = 0; step < found.size(); ++step) {
      SCOPED_TRACE(step);
      ltrain.found_inf.fill_(found[step]);
      aten.found_inf.fill_(found[step]);
      ops::update_scaler(ltrain, 1.7, 0.37, 3);
      const torch::Tensor skipped = aten.found_inf.to(torch::kInt64);
      aten.skipped_steps.add_(skipped);
      aten.consecutive_skips.add_(skipped).mul_(skipped);
      torch::Tensor scale = aten.scale, tracker = aten.growth_tracker;
      at::_amp_update_scale_(scale, tracker, aten.found_inf, 1.7, 0.37, 3);
      EXPECT_TRUE(torch::equal(ltrain.scale, aten.scale))
          << ltrain.scale.item<float>() << " against " << aten.scale.item<float>();
      EXPECT_TRUE(torch::equal(ltrain.growth_tracker, aten.growth_tracker));
      EXPECT_TRUE(torch::equal(ltrain.skipped_steps, aten.skipped_steps));
      EXPECT_TRUE(torch::equal(ltrain.consecutive_skips, aten.consecutive_skips));
    }
    EXPECT_EQ(ltrain.skipped_steps.item<int64_t>(), 3);
    EXPECT_TRUE(ltrain.scale.isfinite().all().item<bool>());
  }
}

TEST(GradScaler, SkipsAndBacksOffOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const auto loaded = gpu_config({"precision.mode=fp16"});
  models::ResNet model = engine::build_model(loaded, torch::kCUDA);
  auto optimizer =
      optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*model));
  amp::GradScaler scaler(engine::grad_scaler_options(loaded.config.precision), torch::kCUDA);
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

}  // namespace
}  // namespace ltrain
