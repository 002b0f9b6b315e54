#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/config/config.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/ops/gradient_kernels.h"
#include "ltrain/optim/optimizer.h"
#include "ltrain/optim/schedule.h"
#include "support.h"

namespace ltrain::optim {
namespace {

/// Two parameters (a matrix and a bias) with fixed pseudo-random gradients per step.
struct Problem {
  std::vector<torch::Tensor> params;
  NamedTensors named;
  explicit Problem(uint64_t seed) {
    torch::manual_seed(seed);
    params = {torch::randn({4, 3}, torch::kFloat64).requires_grad_(), torch::randn({4}, torch::kFloat64).requires_grad_()};
    named = {{"weight", params[0]}, {"bias", params[1]}};
  }
  void set_gradients(int step) {
    for (size_t i = 0; i < params.size(); ++i) {
      torch::manual_seed(1000 + static_cast<uint64_t>(step) * 7 + i);
      params[i].mutable_grad() = torch::randn_like(params[i]);
    }
  }
};

/// The optim section's defaults, as the optimizer's options.
OptimizerOptions default_options() { return engine::optimizer_options(config::OptimSection{}); }

OptimizerOptions sgd_options(double momentum, bool nesterov, double weight_decay) {
  OptimizerOptions o = default_options();
  o.name = config::OptimizerKind::sgd;
  o.momentum = momentum;
  o.nesterov = nesterov;
  o.weight_decay = weight_decay;
  return o;
}

// LibTorch's own torch::optim implements PyTorch's update rules: ours must produce its values.
void expect_same_trajectory(const OptimizerOptions& options, torch::optim::Optimizer& reference_optimizer,
                            Problem& ours, Problem& reference, const std::vector<double>& lrs) {
  auto optimizer = make_optimizer(options, ours.named);
  for (size_t step = 0; step < lrs.size(); ++step) {
    ours.set_gradients(static_cast<int>(step));
    reference.set_gradients(static_cast<int>(step));
    optimizer->set_lr(lrs[step]);
    for (auto& group : reference_optimizer.param_groups()) group.options().set_lr(lrs[step]);
    optimizer->step();
    reference_optimizer.step();
    for (size_t i = 0; i < ours.params.size(); ++i)
      EXPECT_TRUE(torch::allclose(ours.params[i], reference.params[i], 1e-6, 1e-7))
          << "step " << step << " param " << i << "\n"
          << ours.params[i] - reference.params[i];
  }
}

TEST(Optimizer, SgdProducesPyTorchValues) {
  for (const auto& [momentum, nesterov, decay] : std::vector<std::tuple<double, bool, double>>{
           {0.0, false, 0.0}, {0.9, false, 5e-4}, {0.9, true, 1e-2}}) {
    Problem ours(1), reference(1);
    torch::optim::SGD sgd(reference.params,
                          torch::optim::SGDOptions(0.1).momentum(momentum).nesterov(nesterov).weight_decay(decay));
    expect_same_trajectory(sgd_options(momentum, nesterov, decay), sgd, ours, reference, {0.1, 0.05, 0.2, 0.1, 0.01});
  }
}

TEST(Optimizer, AdamWProducesPyTorchValues) {
  Problem ours(2), reference(2);
  OptimizerOptions options = default_options();
  options.name = config::OptimizerKind::adamw;
  options.weight_decay = 0.05;
  options.betas = {0.8, 0.95};
  options.eps = 1e-8;
  torch::optim::AdamW adamw(reference.params,
                            torch::optim::AdamWOptions(1e-3).betas({0.8, 0.95}).eps(1e-8).weight_decay(0.05));
  expect_same_trajectory(options, adamw, ours, reference, {1e-3, 2e-3, 5e-4, 1e-3, 1e-3, 3e-3});
}

TEST(Optimizer, NoDecayForNormAndBias) {
  Problem problem(3);
  const auto groups = make_param_groups(problem.named, 0.1, /*no_decay_norm_and_bias=*/true);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].names, std::vector<std::string>{"weight"});
  EXPECT_DOUBLE_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].names, std::vector<std::string>{"bias"});
  EXPECT_DOUBLE_EQ(groups[1].weight_decay, 0.0);
  EXPECT_EQ(make_param_groups(problem.named, 0.1, false).size(), 1u);
}

TEST(Optimizer, ZeroLearningRateLeavesWeightsAndStateRoundTrips) {
  Problem problem(4);
  auto optimizer = make_optimizer(sgd_options(0.9, false, 0.0), problem.named);
  const torch::Tensor before = problem.params[0].detach().clone();
  problem.set_gradients(0);
  optimizer->set_lr(0.0);
  optimizer->step();
  EXPECT_TRUE(torch::equal(problem.params[0], before));
  EXPECT_GT(optimizer->state().at(0).second.abs().sum().item<double>(), 0.0);  // momentum moved

  Problem other(4);
  auto restored = make_optimizer(sgd_options(0.9, false, 0.0), other.named);
  restored->load_state(optimizer->state());
  for (size_t i = 0; i < optimizer->state().size(); ++i)
    EXPECT_TRUE(torch::equal(restored->state()[i].second, optimizer->state()[i].second));
  EXPECT_THROW(restored->load_state({{"momentum_buffer/weight", torch::zeros({2})}, {"x", torch::zeros({4})}}),
               std::exception);
}

TEST(Optimizer, ZeroGradDropsOrZeroesInPlace) {
  Problem problem(5);
  auto optimizer = make_optimizer(sgd_options(0.9, false, 0.0), problem.named);
  problem.set_gradients(0);
  const void* address = problem.params[0].grad().data_ptr();
  optimizer->zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(problem.params[0].grad().data_ptr(), address);
  EXPECT_EQ(problem.params[0].grad().abs().sum().item<double>(), 0.0);
  optimizer->zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(problem.params[0].grad().defined());
  EXPECT_FALSE(problem.params[1].grad().defined());
}

/// The schedule section's defaults but for `kind`, as the schedule's options.
ScheduleOptions schedule_of(config::ScheduleKind kind) {
  ScheduleOptions s = engine::schedule_options(config::ScheduleSection{});
  s.name = kind;
  return s;
}

TEST(Schedule, ConstantWithLinearWarmup) {
  auto options = schedule_of(config::ScheduleKind::constant);
  options.warmup_epochs = 1.0;
  options.warmup_start_factor = 0.1;
  const LrSchedule schedule(options, 0.5, /*total_steps=*/100, /*steps_per_epoch=*/10);
  EXPECT_EQ(schedule.warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.05);
  EXPECT_DOUBLE_EQ(schedule.at(5), 0.5 * (0.1 + 0.9 * 0.5));
  EXPECT_DOUBLE_EQ(schedule.at(10), 0.5);
  EXPECT_DOUBLE_EQ(schedule.at(99), 0.5);
}

TEST(Schedule, MultistepAtMilestoneEpochs) {
  auto options = schedule_of(config::ScheduleKind::multistep);
  options.milestones = {2, 4};
  options.gamma = 0.1;
  const LrSchedule schedule(options, 1.0, 60, 10);
  EXPECT_DOUBLE_EQ(schedule.at(19), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(20), 0.1);
  EXPECT_NEAR(schedule.at(39), 0.1, 1e-15);
  EXPECT_NEAR(schedule.at(40), 0.01, 1e-15);
}

TEST(Schedule, CosineFromPeakToMinimumAfterWarmup) {
  auto options = schedule_of(config::ScheduleKind::cosine);
  options.min_lr = 0.01;
  options.warmup_epochs = 1;
  const LrSchedule schedule(options, 1.0, 110, 10);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1.0);
  EXPECT_NEAR(schedule.at(60), 0.01 + 0.99 * 0.5, 1e-12);  // half way through the 100 cosine steps
  EXPECT_NEAR(schedule.at(110), 0.01, 1e-12);
  EXPECT_LT(schedule.at(109), schedule.at(108));
}

TEST(Schedule, OneCycleProducesPyTorchValues) {
  // torch.optim.lr_scheduler.OneCycleLR(max_lr=1, total_steps=10, pct_start=0.3, div_factor=25,
  // final_div_factor=1e4): rise over steps 0..2 (end_step = 0.3*10 - 1), fall over 2..9.
  auto options = schedule_of(config::ScheduleKind::onecycle);
  const LrSchedule schedule(options, 1.0, 10, 5);
  const double initial = 1.0 / 25;
  const double final_lr = initial / 1e4;
  EXPECT_NEAR(schedule.at(0), initial, 1e-15);
  EXPECT_NEAR(schedule.at(1), 1.0 + (initial - 1.0) / 2 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(schedule.at(2), 1.0);
  EXPECT_NEAR(schedule.at(5), final_lr + (1.0 - final_lr) / 2 * (1 + std::cos(M_PI * 3.0 / 7.0)), 1e-12);
  EXPECT_NEAR(schedule.at(9), final_lr, 1e-15);
}

TEST(Optimizer, FusedAndPortableAgreeOnTheGpu_CUDA) {
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
    OptimizerOptions options = default_options();
    options.name = name == std::string("sgd") ? config::OptimizerKind::sgd : config::OptimizerKind::adamw;
    const double lr = 0.05;
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
        EXPECT_EQ(std::string(optimizer->step_kernel()), ops::ltrain_gradient_kernels_fit(torch::kCUDA).runs
                                                             ? "fused (ltrain's SGD kernel)"
                                                             : "fused (LibTorch's SGD kernel)");
      }
      optimizer->set_lr(lr);
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

}  // namespace
}  // namespace ltrain::optim
