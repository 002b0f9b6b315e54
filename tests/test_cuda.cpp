// GPU-only behaviour, skipped where no CUDA device is usable (run on the GPU host).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/amp/autocast.h"
#include "ltrain/amp/grad_scaler.h"
#include "ltrain/amp/precision.h"
#include "ltrain/config/load.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"
#include "support.h"

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
  const std::vector<std::vector<int64_t>> shapes{{16, 3, 3, 3}, {16}, {16}, {10, 16}, {10}};
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(3);
  optim::NamedTensors initial;
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
      optim::NamedTensors params;
      for (const auto& [key, tensor] : initial) params.emplace_back(key, tensor.clone().requires_grad_(true));
      options.fused = fused;
      auto optimizer = optim::make_optimizer(options, params);
      EXPECT_EQ(optimizer->fused(), fused) << name;
      optimizer->set_lr(options.lr);
      const torch::Tensor grad_scale = torch::full({1}, scale, cuda);
      for (size_t step = 0; step < scaled_grads.size(); ++step) {
        for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = scaled_grads[step][i].clone();
        const torch::Tensor found_inf = torch::full({1}, step == 1 ? 1.0 : 0.0, cuda);
        optimizer->step({grad_scale, found_inf});
      }
      optim::NamedTensors out = params;
      for (const auto& entry : optimizer->state()) out.push_back(entry);
      return out;
    };
    const optim::NamedTensors fused = run(true), portable = run(false);
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
    compat::set_cudnn(false, true);  // deterministic algorithms on both sides
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

}  // namespace
}  // namespace ltrain
