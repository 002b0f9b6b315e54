#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/optim/optimizer.h"
#include "ltrain/optim/schedule.h"

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

config::OptimSection sgd_options(double momentum, bool nesterov, double weight_decay) {
  config::OptimSection o;
  o.name = config::OptimizerKind::sgd;
  o.lr = 0.1;
  o.momentum = momentum;
  o.nesterov = nesterov;
  o.weight_decay = weight_decay;
  return o;
}

// LibTorch's own torch::optim implements PyTorch's update rules: ours must produce its values.
void expect_same_trajectory(const config::OptimSection& options, torch::optim::Optimizer& reference_optimizer,
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
  config::OptimSection options;
  options.name = config::OptimizerKind::adamw;
  options.lr = 1e-3;
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

config::ScheduleSection schedule_of(config::ScheduleKind kind) {
  config::ScheduleSection s;
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

}  // namespace
}  // namespace ltrain::optim
