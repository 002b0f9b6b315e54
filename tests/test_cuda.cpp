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

/// Trains `steps` steps on one fixed batch; returns the model's weights and each step's loss.
std::pair<std::vector<torch::Tensor>, std::vector<double>> train_fixed_batch(const config::LoadedConfig& loaded,
                                                                             int steps, bool inject_inf_at_step_2) {
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
    data::Batch input = batch;
    if (inject_inf_at_step_2 && i == 2) {  // an overflowing input makes every gradient inf/NaN
      input.images = batch.images.clone();
      input.images[0][0][0][0] = std::numeric_limits<float>::infinity();
    }
    step.run(input);
    losses.push_back(step.take_totals().mean_loss());
  }
  std::vector<torch::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().cpu().clone());
  return {weights, losses};
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
    const auto [weights, losses] = train_fixed_batch(gpu_config({std::string("precision.mode=") + mode}), 12, false);
    for (double loss : losses) EXPECT_TRUE(std::isfinite(loss)) << mode;
    EXPECT_LT(losses.back(), 0.5 * losses.front()) << mode;  // one batch is memorized quickly
  }
}

TEST(MixedPrecision, FusedAndPortableOptimizersAgree_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  if (!compat::has_fused_optimizers()) GTEST_SKIP() << "this LibTorch has no fused optimizers";
  for (const char* optimizer : {"sgd", "adamw"}) {
    // Deterministic kernels: the two runs differ only in the optimizer's arithmetic.
    const std::vector<std::string> common{"precision.mode=fp16", std::string("optim.name=") + optimizer,
                                          "optim.lr=0.01", "optim.no_decay_norm_and_bias=true",
                                          "precision.deterministic=true"};
    auto fused_config = common, portable_config = common;
    fused_config.push_back("optim.fused=true");
    portable_config.push_back("optim.fused=false");
    // fp16 with an injected inf step: both paths must skip it on the device.
    const auto fused = train_fixed_batch(gpu_config(fused_config), 6, true);
    const auto portable = train_fixed_batch(gpu_config(portable_config), 6, true);
    EXPECT_LT(max_relative_difference(fused.first, portable.first), 1e-3) << optimizer;
    for (size_t i = 0; i < fused.second.size(); ++i)
      EXPECT_NEAR(fused.second[i], portable.second[i], 1e-3 * std::abs(portable.second[i])) << optimizer << " step " << i;
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
