// Whole-step and evaluation CUDA graphs against the eager path (GPU only; skipped elsewhere).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "ltrain/amp/grad_scaler.h"
#include "ltrain/config/load.h"
#include "ltrain/core/gpu.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/batch_graph.h"
#include "ltrain/engine/evaluator.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/train_step.h"
#include "support.h"

#if LTRAIN_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace ltrain {
namespace {

config::LoadedConfig graph_test_config(const std::vector<std::string>& extra) {
  return testing::config_from({"run.device=cuda", "model.arch=resnet18", "model.stem=cifar", "model.width=16",
                               "data.batch_size=32", "optim.lr=0.05", "cuda_graph.warmup_steps=2",
                               "precision.deterministic=true"},
                              extra);
}

/// What a run of steps leaves behind, for comparing two runs.
struct StepRecord {
  std::vector<double> losses;   // per step
  std::vector<double> scales;   // per step (1 without a scaler)
  int64_t skipped_steps = 0;
  std::vector<torch::Tensor> weights;  // parameters and buffers at the end, on the CPU
  bool graphed = false;
  int64_t parameters_updated_in_backward = 0;  // by the last step
  int64_t convolution_weights = 0;              // the model's
};

/// Runs `batches.size()` steps from a fresh model (run.seed), the LR of step i being lrs[i]. With
/// `inf_step` >= 0 the gradient of bn1.weight is multiplied by infinity in that step (through a
/// hook, which a graph captures like any backward work), so the step must be skipped.
StepRecord run_steps(const config::LoadedConfig& loaded, const std::vector<data::Batch>& batches,
                     const std::vector<double>& lrs, int64_t inf_step) {
  engine::apply_runtime_settings(loaded.config);
  const torch::Device device = engine::resolve_device(loaded);
  models::ResNet model = engine::build_model(loaded, device);
  const NamedTensors params = engine::named_parameters(*model);
  const torch::Tensor gradient_factor = torch::ones({}, torch::TensorOptions().device(device));  // [] float32
  if (inf_step >= 0) {
    torch::Tensor bn1_weight = *find_tensor(params, "bn1.weight");
    bn1_weight.register_hook([gradient_factor](const torch::Tensor& grad) { return grad * gradient_factor; });
  }
  auto optimizer = optim::make_optimizer(engine::optimizer_options(loaded.config.optim), params);
  amp::GradScaler scaler(engine::grad_scaler_options(loaded.config.precision), device);
  engine::TrainStep step(model, *optimizer, scaler, loaded.config);
  StepRecord record;
  for (size_t i = 0; i < batches.size(); ++i) {
    optimizer->set_lr(lrs[i]);
    gradient_factor.fill_(static_cast<int64_t>(i) == inf_step ? std::numeric_limits<double>::infinity() : 1.0);
    step.run(batches[i]);
    const engine::StepTotals totals = step.take_totals();
    record.losses.push_back(totals.mean_loss());
    record.scales.push_back(totals.loss_scale);
    record.skipped_steps = totals.skipped_steps;
  }
  for (const auto& [name, tensor] : engine::state_dict(*model)) record.weights.push_back(tensor.detach().cpu().clone());
  record.graphed = step.graphed();
  record.parameters_updated_in_backward = step.parameters_updated_in_backward();
  for (const auto& [name, param] : params) record.convolution_weights += param.dim() == 4 ? 1 : 0;
  return record;
}

std::vector<data::Batch> random_batches(int64_t count, int64_t size) {
  torch::manual_seed(11);
  std::vector<data::Batch> batches;
  for (int64_t i = 0; i < count; ++i)
    batches.push_back({torch::randn({size, 3, 32, 32}).cuda(), torch::randint(0, 10, {size}, torch::kInt64).cuda()});
  return batches;
}

TEST(CudaGraph, GraphedStepsMatchEagerSteps_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const std::vector<std::vector<std::string>> variants{
      {"precision.mode=fp16", "model.channels_last=true"},
      {"precision.mode=bf16"},
      {"precision.mode=fp32", "optim.clip_grad_norm=1.0", "optim.name=adamw", "optim.lr=0.001"},
      {"precision.mode=fp16", "optim.accumulation_steps=2", "model.checkpoint_segments=2"},
      {"precision.mode=fp16", "optim.fused=false"},
  };
  for (const auto& variant : variants) {
    const auto eager = graph_test_config(variant);
    std::vector<std::string> graphed_variant = variant;
    // The eager step's images as they are (padded ones round differently in cuDNN's stem).
    graphed_variant.insert(graphed_variant.end(), {"cuda_graph.train=true", "cuda_graph.padded_images=false"});
    const auto graphed = graph_test_config(graphed_variant);
    const int64_t images = eager.config.data.batch_size * eager.config.optim.accumulation_steps;
    const std::vector<data::Batch> batches = random_batches(8, images);
    const bool fp16 = eager.config.precision.mode == config::PrecisionMode::fp16;
    // fp16: step 5 (a replay) gets an inf gradient; both paths must skip it and back the scale off.
    const int64_t inf_step = fp16 ? 5 : -1;
    // Every step its own LR, and one of zero: the graph must read the LR written before each replay.
    const double base_lr = eager.config.optim.lr;
    const std::vector<double> lrs{base_lr, base_lr, base_lr * 0.9, base_lr * 0.8, 0.0, base_lr * 0.6, base_lr * 0.5,
                                  base_lr * 0.25};

    const StepRecord a = run_steps(eager, batches, lrs, inf_step);
    const StepRecord b = run_steps(graphed, batches, lrs, inf_step);
    std::string name;
    for (const auto& setting : variant) name += setting + " ";
    EXPECT_FALSE(a.graphed) << name;
    EXPECT_TRUE(b.graphed) << name;
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-3 * std::abs(a.losses[i]) + 1e-5) << name << " step " << i;
      EXPECT_EQ(a.scales[i], b.scales[i]) << name << " step " << i;
    }
    EXPECT_EQ(a.skipped_steps, fp16 ? 1 : 0) << name;
    if (fp16) {
      EXPECT_EQ(a.scales[5], 0.5 * a.scales[4]) << name;
    }
    EXPECT_EQ(a.skipped_steps, b.skipped_steps) << name;
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t i = 0; i < a.weights.size(); ++i) {
      const torch::Tensor x = a.weights[i].to(torch::kFloat64), y = b.weights[i].to(torch::kFloat64);
      EXPECT_LE((x - y).norm().item<double>(), 1e-4 * x.norm().item<double>() + 1e-6) << name << " tensor " << i;
    }
  }
}

TEST(CudaGraph, BranchesGiveTheLossesAndWeightsOfOneStreamBitForBit_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // The weight gradients on the branch stream (cuda_graph.branches) run the kernels of the one-stream
  // step on the same inputs: with deterministic cuDNN every loss and weight is the same bit for bit,
  // through warm-up, capture and replays, a skipped fp16 step, accumulation (float32 weights: each
  // weight gradient joined at once, since autograd adds the second micro-batch's to the first) and
  // recomputed segments.
  const std::vector<std::vector<std::string>> variants{
      {"precision.mode=fp16", "model.channels_last=true"},
      {"precision.mode=bf16", "model.channels_last=true", "model.arch=resnet50", "model.width=8"},
      {"precision.mode=fp16", "optim.accumulation_steps=2", "model.checkpoint_segments=2"},
      {"precision.mode=fp32", "optim.accumulation_steps=2"},
  };
  for (const auto& variant : variants) {
    std::vector<std::string> one_stream = variant, branched = variant;
    one_stream.insert(one_stream.end(), {"cuda_graph.train=true", "cuda_graph.branches=off"});
    branched.insert(branched.end(), {"cuda_graph.train=true", "cuda_graph.branches=on"});
    const auto a_config = graph_test_config(one_stream), b_config = graph_test_config(branched);
    const int64_t images = a_config.config.data.batch_size * a_config.config.optim.accumulation_steps;
    const std::vector<data::Batch> batches = random_batches(6, images);
    const bool fp16 = a_config.config.precision.mode == config::PrecisionMode::fp16;
    const std::vector<double> lrs(batches.size(), a_config.config.optim.lr);
    const StepRecord a = run_steps(a_config, batches, lrs, fp16 ? 4 : -1);
    const StepRecord b = run_steps(b_config, batches, lrs, fp16 ? 4 : -1);
    std::string name;
    for (const auto& setting : variant) name += setting + " ";
    EXPECT_TRUE(a.graphed && b.graphed) << name;
    EXPECT_EQ(a.losses, b.losses) << name;
    EXPECT_EQ(a.scales, b.scales) << name;
    EXPECT_EQ(a.skipped_steps, fp16 ? 1 : 0) << name;
    EXPECT_EQ(a.skipped_steps, b.skipped_steps) << name;
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t i = 0; i < a.weights.size(); ++i) EXPECT_TRUE(torch::equal(a.weights[i], b.weights[i])) << name << i;
  }
}

TEST(CudaGraph, PaddedImagesTrainAsTheImagesThemselves_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // cuda_graph.padded_images: fp16 images with a fourth, zero channel (bf16: 8 channels) and the
  // stem's weight extended to match, in the warm-up steps as in the graph. The same convolution in
  // exact arithmetic, not in cuDNN's, whose kernels for 4 or 8 channels may round otherwise than
  // those for 3: the losses agree to rounding, and so does the state as a whole. Not each tensor:
  // rounding flips ReLUs whose inputs sit near zero, and a BatchNorm bias, which starts at zero and
  // whose gradient is a sum of terms that nearly cancel, moves by tens of percent of its own size
  // over a few fp16 steps, as it does under another loss scale (which changes nothing but
  // rounding). The padding itself is checked exactly by
  // Convolution.ImageChannelsPastTheWeightsAddNothing and its _OnTheBranch_CUDA twin.
  struct Case {
    const char* mode;
    double first_loss_tolerance, loss_tolerance, state_tolerance;  // relative
  };
  for (const Case& c : {Case{"precision.mode=fp16", 2e-3, 2e-2, 3e-2}, Case{"precision.mode=bf16", 1e-2, 5e-2, 5e-2}}) {
    const std::vector<std::string> settings{c.mode, "model.channels_last=true", "cuda_graph.train=true",
                                            "cuda_graph.branches=on"};
    std::vector<std::string> unpadded = settings;
    unpadded.push_back("cuda_graph.padded_images=false");
    const auto padded_config = graph_test_config(settings), unpadded_config = graph_test_config(unpadded);
    const std::vector<data::Batch> batches = random_batches(4, padded_config.config.data.batch_size);
    const std::vector<double> lrs(batches.size(), padded_config.config.optim.lr);
    const StepRecord a = run_steps(padded_config, batches, lrs, -1);
    const StepRecord b = run_steps(unpadded_config, batches, lrs, -1);
    EXPECT_TRUE(a.graphed && b.graphed) << c.mode;
    EXPECT_EQ(a.scales, b.scales) << c.mode;
    EXPECT_EQ(a.skipped_steps, b.skipped_steps) << c.mode;
    EXPECT_NEAR(a.losses[0], b.losses[0], c.first_loss_tolerance * std::abs(b.losses[0])) << c.mode;
    for (size_t i = 0; i < a.losses.size(); ++i)
      EXPECT_NEAR(a.losses[i], b.losses[i], c.loss_tolerance * std::abs(b.losses[i])) << c.mode << " step " << i;
    ASSERT_EQ(a.weights.size(), b.weights.size());
    double difference_squared = 0.0, norm_squared = 0.0;  // over the floating-point state
    for (size_t i = 0; i < a.weights.size(); ++i) {
      if (!a.weights[i].is_floating_point()) {  // the BatchNorm counters
        EXPECT_TRUE(torch::equal(a.weights[i], b.weights[i])) << c.mode << " tensor " << i;
        continue;
      }
      const torch::Tensor x = a.weights[i].to(torch::kFloat64), y = b.weights[i].to(torch::kFloat64);
      difference_squared += (x - y).pow(2).sum().item<double>();
      norm_squared += y.pow(2).sum().item<double>();
    }
    EXPECT_LE(std::sqrt(difference_squared), c.state_tolerance * std::sqrt(norm_squared)) << c.mode;
  }
}

TEST(CudaGraph, UpdatesInBackwardGiveTheLossesAndWeightsOfUpdatesAtTheEndBitForBit_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // cuda_graph.updates_in_backward: each convolution weight's SGD update on the branch as soon as
  // its gradient is complete, by the same kernel on the same numbers as at the step's end: every
  // loss and weight the same bit for bit, through warm-up, capture and replays, with momentum
  // (Nesterov) or without, with fp16/bf16 copies of the weights or float32 weights, and with
  // recomputed segments (whose convolutions run again inside the backward pass).
  const std::vector<std::vector<std::string>> variants{
      {"precision.mode=bf16", "model.channels_last=true", "model.arch=resnet50", "model.width=8",
       "optim.nesterov=true"},
      {"precision.mode=fp32", "optim.momentum=0"},
      {"precision.mode=bf16", "model.checkpoint_segments=2", "optim.weight_decay=0.01"},
  };
  for (const auto& variant : variants) {
    std::vector<std::string> at_end = variant, in_backward = variant;
    at_end.insert(at_end.end(), {"cuda_graph.train=true", "cuda_graph.branches=on"});
    in_backward.insert(in_backward.end(),
                       {"cuda_graph.train=true", "cuda_graph.branches=on", "cuda_graph.updates_in_backward=true"});
    const auto a_config = graph_test_config(at_end), b_config = graph_test_config(in_backward);
    const std::vector<data::Batch> batches = random_batches(6, a_config.config.data.batch_size);
    std::vector<double> lrs(batches.size(), a_config.config.optim.lr);
    lrs[3] = 0.5 * lrs[3];  // the graph reads the LR written before each replay
    const StepRecord a = run_steps(a_config, batches, lrs, -1);
    const StepRecord b = run_steps(b_config, batches, lrs, -1);
    std::string name;
    for (const auto& setting : variant) name += setting + " ";
    EXPECT_TRUE(a.graphed && b.graphed) << name;
    EXPECT_EQ(a.parameters_updated_in_backward, 0) << name;
    EXPECT_EQ(b.parameters_updated_in_backward, b.convolution_weights) << name;
    EXPECT_GT(b.convolution_weights, 0) << name;
    EXPECT_EQ(a.losses, b.losses) << name;
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t i = 0; i < a.weights.size(); ++i) EXPECT_TRUE(torch::equal(a.weights[i], b.weights[i])) << name << i;
  }
}

TEST(CudaGraph, UpdatesStayAtTheStepsEndWhereSomethingReadsTheGradientsFirst_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // The GradScaler's check, accumulation and clipping read every gradient before any update: with
  // them the setting leaves every update at the step's end, and the steps train as without it.
  const std::vector<std::vector<std::string>> variants{
      {"precision.mode=fp16"},
      {"precision.mode=bf16", "optim.accumulation_steps=2"},
      {"precision.mode=bf16", "optim.clip_grad_norm=1.0"},
  };
  for (const auto& variant : variants) {
    std::vector<std::string> settings = variant;
    settings.insert(settings.end(),
                    {"cuda_graph.train=true", "cuda_graph.branches=on", "cuda_graph.updates_in_backward=true"});
    const auto loaded = graph_test_config(settings);
    const int64_t images = loaded.config.data.batch_size * loaded.config.optim.accumulation_steps;
    const std::vector<data::Batch> batches = random_batches(4, images);
    const StepRecord record =
        run_steps(loaded, batches, std::vector<double>(batches.size(), loaded.config.optim.lr), -1);
    std::string name;
    for (const auto& setting : variant) name += setting + " ";
    EXPECT_TRUE(record.graphed) << name;
    EXPECT_EQ(record.parameters_updated_in_backward, 0) << name;
    for (const double loss : record.losses) EXPECT_TRUE(std::isfinite(loss)) << name;
  }
}

TEST(CudaGraph, DependentLaunchesGiveTheStepsOfPlainLaunches_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // cuda_graph.dependent_launch: ltrain's BatchNorm kernels captured as programmatic dependents
  // (sm_90 and later; elsewhere the setting changes nothing), those of the cluster reduction (auto)
  // or all (on). The capture must take them, and each must still read what the kernel before it
  // wrote. At the imagenet stem and batch 4 every BatchNorm reduces within one cluster (fixed
  // order); cuDNN may choose non-deterministic algorithms here, since deterministic mode would turn
  // ltrain's kernels off, so the runs agree to rounding rather than bit for bit.
  std::vector<StepRecord> records;
  for (const std::string setting : {"off", "auto", "on"}) {
    const auto loaded =
        graph_test_config({"precision.mode=fp16", "model.channels_last=true", "model.stem=imagenet",
                           "data.batch_size=4", "precision.deterministic=false", "cuda_graph.train=true",
                           "cuda_graph.dependent_launch=" + setting});
    const std::vector<data::Batch> batches = random_batches(6, 4);
    records.push_back(run_steps(loaded, batches, std::vector<double>(batches.size(), loaded.config.optim.lr), -1));
  }
  engine::apply_runtime_settings(graph_test_config({}).config);  // the setting is process-wide: off again
  const StepRecord& plain = records[0];
  EXPECT_TRUE(plain.graphed);
  for (size_t r = 1; r < records.size(); ++r) {
    const StepRecord& dependent = records[r];
    SCOPED_TRACE(r == 1 ? "auto" : "on");
    EXPECT_TRUE(dependent.graphed);
    ASSERT_EQ(plain.losses.size(), dependent.losses.size());
    for (size_t i = 0; i < plain.losses.size(); ++i)
      EXPECT_NEAR(dependent.losses[i], plain.losses[i], 1e-3 * std::abs(plain.losses[i])) << "step " << i;
    ASSERT_EQ(plain.weights.size(), dependent.weights.size());
    for (size_t i = 0; i < plain.weights.size(); ++i)
      EXPECT_TRUE(torch::allclose(dependent.weights[i].to(torch::kFloat32), plain.weights[i].to(torch::kFloat32),
                                  /*rtol=*/1e-2, /*atol=*/1e-3))
          << i;
  }
}

TEST(CudaGraph, AutoBranchesTheStepsWhoseFirstStageIsSmall_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // cuda_graph.branches=auto: the branch for a batch of 32 at the cifar stem (32 x 32 x 32 first-stage
  // positions) and of 128, not for 512 (512 x 32 x 32), nor in an eager step; the critical path
  // above the branch for 32 alone (at most 1024 x 8 x 8 positions). The model gets its one-stream
  // convolutions back with the step.
  using Case = std::tuple<int64_t, bool, bool, gpu::StreamPriority>;
  for (const auto& [batch, graphed, branched, priority] :
       {Case{32, true, true, gpu::StreamPriority::high}, Case{128, true, true, gpu::StreamPriority::normal},
        Case{512, true, false, gpu::StreamPriority::normal}, Case{32, false, false, gpu::StreamPriority::normal}}) {
    const auto loaded = graph_test_config({"precision.mode=bf16", "model.channels_last=true",
                                           "cuda_graph.train=" + std::string(graphed ? "true" : "false")});
    engine::apply_runtime_settings(loaded.config);
    models::ResNet model = engine::build_model(loaded, torch::kCUDA);
    auto optimizer =
        optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*model));
    amp::GradScaler scaler(engine::grad_scaler_options(loaded.config.precision), torch::kCUDA);
    {
      engine::TrainStep step(model, *optimizer, scaler, loaded.config);
      step.run(random_batches(1, batch).front());
      EXPECT_EQ(model->convolution_backends().weight_gradient_branch, branched) << batch << " " << graphed;
      EXPECT_EQ(step.capture_priority(), priority) << batch << " " << graphed;
    }
    EXPECT_FALSE(model->convolution_backends().weight_gradient_branch);
  }
}

#if LTRAIN_WITH_CUDA
/// The priorities of the kernel nodes captured so far into the graph `stream` is capturing.
std::multiset<int> captured_kernel_priorities(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id, &graph));
  size_t count = 0;
  C10_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  C10_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  std::multiset<int> priorities;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    C10_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeAttrValue value{};
    C10_CUDA_CHECK(cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributePriority, &value));
    priorities.insert(value.priority);
  }
  return priorities;
}
#endif

TEST(CudaGraph, AHighPriorityCaptureRanksTheCriticalPathAboveTheBranch_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if LTRAIN_WITH_CUDA
  // A kernel captured into a graph keeps the priority of the stream it was queued on (a lower
  // number goes first). Captured at StreamPriority::high, the critical path outranks the branch;
  // at normal, both have the lowest priority. The work is the same either way.
  const torch::Device device(torch::kCUDA);
  for (const gpu::StreamPriority priority : {gpu::StreamPriority::normal, gpu::StreamPriority::high}) {
    const torch::Tensor critical = torch::zeros({256}, torch::TensorOptions().device(device));  // [256] float32
    const torch::Tensor side = torch::zeros({256}, torch::TensorOptions().device(device));
    int critical_priority = 0, branch_priority = 0;
    std::multiset<int> node_priorities;
    gpu::CudaGraph graph;
    graph.capture(
        device,
        [&] {
          const cudaStream_t capturing = c10::cuda::getCurrentCUDAStream().stream();
          critical.add_(1);
          C10_CUDA_CHECK(cudaStreamGetPriority(capturing, &critical_priority));
          gpu::fork_to_branch(
              device,
              [&] {
                side.add_(2);
                C10_CUDA_CHECK(cudaStreamGetPriority(c10::cuda::getCurrentCUDAStream().stream(), &branch_priority));
              },
              {});
          gpu::join_branch(device);
          node_priorities = captured_kernel_priorities(capturing);
        },
        priority);
    graph.replay();
    graph.replay();
    const bool high = priority == gpu::StreamPriority::high;
    if (high) {
      EXPECT_LT(critical_priority, branch_priority);
    } else {
      EXPECT_EQ(critical_priority, branch_priority);
    }
    EXPECT_EQ(node_priorities, (std::multiset<int>{critical_priority, branch_priority})) << high;
    EXPECT_TRUE(torch::equal(critical.cpu(), torch::full({256}, 2.0))) << high;
    EXPECT_TRUE(torch::equal(side.cpu(), torch::full({256}, 4.0))) << high;
  }
#endif
}

TEST(CudaGraph, ReplayReadsTheLearningRateWrittenBeforeIt_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const auto loaded = graph_test_config({"cuda_graph.train=true", "precision.mode=bf16", "optim.weight_decay=0"});
  engine::apply_runtime_settings(loaded.config);
  models::ResNet model = engine::build_model(loaded, torch::kCUDA);
  auto optimizer =
      optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*model));
  amp::GradScaler scaler(engine::grad_scaler_options(loaded.config.precision), torch::kCUDA);
  engine::TrainStep step(model, *optimizer, scaler, loaded.config);
  const std::vector<data::Batch> batches = random_batches(5, 32);
  optimizer->set_lr(0.05);
  for (size_t i = 0; i < 4; ++i) step.run(batches[i]);  // two warm-up steps, the capture, one replay
  ASSERT_TRUE(step.graphed());
  // With momentum, an LR of zero still leaves the weights where they are (torch.optim.SGD).
  optimizer->set_lr(0.0);
  const torch::Tensor before = model->parameters().front().detach().clone();
  step.run(batches[4]);
  EXPECT_TRUE(torch::equal(model->parameters().front().detach(), before));
  optimizer->set_lr(0.05);
  step.run(batches[4]);
  EXPECT_FALSE(torch::equal(model->parameters().front().detach(), before));
}

TEST(LowPrecisionGradients, StepsMatchStepsFromFloat32Copies_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // optim.fused: ltrain's SGD kernel reads the fp16/bf16 weight gradients as the backward pass
  // leaves them. optim.fused=false: they are copied into float32 gradients first, unscaled and
  // stepped by torch operators. From the same state with deterministic cuDNN the forward and
  // backward passes agree bit for bit, so one applied step may differ by float32 rounding only.
  // (Over several steps the fp16/bf16 copies of weights a rounding apart round apart too, and
  // the runs drift; the tests of the kernel itself pin the arithmetic.) fp16: step 0 has an
  // inf gradient that both must skip, then step 1 is applied.
  for (const char* mode : {"fp16", "bf16"}) {
    const bool fp16 = mode == std::string("fp16");
    const std::vector<data::Batch> batches = random_batches(fp16 ? 2 : 1, 32);
    const std::vector<double> lrs(batches.size(), 0.05);
    const int64_t inf_step = fp16 ? 0 : -1;
    const auto kernel = graph_test_config({std::string("precision.mode=") + mode, "model.channels_last=true"});
    const auto portable = graph_test_config({std::string("precision.mode=") + mode, "model.channels_last=true",
                                             "optim.fused=false"});
    const StepRecord a = run_steps(kernel, batches, lrs, inf_step);
    const StepRecord b = run_steps(portable, batches, lrs, inf_step);
    EXPECT_EQ(a.skipped_steps, fp16 ? 1 : 0) << mode;
    EXPECT_EQ(a.skipped_steps, b.skipped_steps) << mode;
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-6 * std::abs(b.losses[i])) << mode << " step " << i;
      EXPECT_EQ(a.scales[i], b.scales[i]) << mode << " step " << i;
    }
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t i = 0; i < a.weights.size(); ++i) {
      const torch::Tensor x = a.weights[i].to(torch::kFloat64), y = b.weights[i].to(torch::kFloat64);
      EXPECT_LE((x - y).norm().item<double>(), 1e-6 * y.norm().item<double>() + 1e-9) << mode << " tensor " << i;
    }
  }
}

TEST(CudaGraph, GraphedEvaluationCountsEveryImageOnce_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // 250 test images in batches of 64: the first evaluation runs batch 0 eagerly (the warm-up),
  // captures at batch 1 and replays for 1-3; later ones replay for 0-3. The last 58 run eagerly.
  for (const char* mode : {"fp16", "fp32"}) {
    const auto loaded = graph_test_config({"data.source=synthetic", "data.synthetic_train_size=64",
                                           "data.synthetic_test_size=250", "data.eval_batch_size=64",
                                           std::string("precision.mode=") + mode, "cuda_graph.eval=true",
                                           "cuda_graph.padded_images=false", "model.channels_last=true"});
    engine::apply_runtime_settings(loaded.config);
    const data::TrainTestSets sets = engine::load_data(loaded.config, torch::kCUDA);
    const data::EvalLoader loader(sets.test, engine::eval_loader_options(loaded.config.data));
    models::ResNet model = engine::build_model(loaded, torch::kCUDA);
    engine::Evaluator graphed(model, loader, loaded.config);
    for (int round = 0; round < 3; ++round) {
      const engine::EvalResult expected = engine::evaluate(model, loader, loaded.config);
      const engine::EvalResult got = graphed.run();
      EXPECT_EQ(got.images, 250);
      EXPECT_EQ(got.correct, expected.correct) << mode << " round " << round;
      EXPECT_NEAR(got.loss, expected.loss, 1e-5 * expected.loss) << mode << " round " << round;
      // New weights between evaluations: the graph reads them in place.
      torch::NoGradGuard no_grad;
      for (const auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
  }
}

TEST(CudaGraph, ABatchOfANewShapeIsWarmedUpAndCapturedAnew_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // Progressive resizing hands the step batches of a new side now and then: each new shape runs
  // its warm-up eagerly again and gets its own capture, and every call computes on its own batch.
  engine::BatchGraph graph(/*warmup_runs=*/1, {torch::MemoryFormat::ChannelsLast, std::nullopt, 0});
  const auto sink = torch::zeros({}, torch::kFloat64).cuda();  // [] float64: the last batch's sum
  const engine::BatchGraph::Work work = [&](const torch::Tensor& images, const torch::Tensor& labels) {
    sink.copy_(images.to(torch::kFloat64).sum() + labels.sum());
  };
  torch::manual_seed(3);
  int64_t call = 0;
  for (const int64_t side : {16, 16, 16, 24, 24, 24, 32}) {
    const data::Batch batch{torch::randn({4, 3, side, side}).cuda(), torch::randint(0, 10, {4}, torch::kInt64).cuda()};
    graph.run(batch, work);
    const double expected = batch.images.to(torch::kFloat64).sum().item<double>() + batch.labels.sum().item<double>();
    EXPECT_NEAR(sink.item<double>(), expected, 1e-9 * std::abs(expected) + 1e-9) << "call " << call;
    ++call;
  }
  // 16: warm-up, capture, replay; 24: the same; 32: warm-up only.
  EXPECT_EQ(graph.captures(), 2);
  EXPECT_FALSE(graph.captured());
}

TEST(CudaGraph, StaticImagesHoldTheBatchRoundedAsAutocastWouldWithZeroChannelsPastIt_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // fp16 images with 4 channels in channels_last, in the warm-up as in the captured calls: the
  // batch's float32 images cast as autocast casts them, the fourth channel zero.
  engine::BatchGraph graph(/*warmup_runs=*/1, {torch::MemoryFormat::ChannelsLast, torch::kHalf, 4});
  torch::Tensor seen;  // a copy of what the last call's work was given
  const engine::BatchGraph::Work work = [&](const torch::Tensor& images, const torch::Tensor&) {
    EXPECT_EQ(images.scalar_type(), torch::kHalf);
    EXPECT_TRUE(images.is_contiguous(torch::MemoryFormat::ChannelsLast));
    seen = images.clone(torch::MemoryFormat::ChannelsLast);
  };
  torch::manual_seed(4);
  for (int call = 0; call < 3; ++call) {  // warm-up, capture and replay, replay
    const data::Batch batch{torch::randn({2, 3, 8, 8}).cuda(), torch::randint(0, 10, {2}, torch::kInt64).cuda()};
    graph.run(batch, work);
    const torch::Tensor images = graph.captured() ? graph.static_images() : seen;
    ASSERT_EQ(images.sizes(), torch::IntArrayRef({2, 4, 8, 8})) << "call " << call;
    EXPECT_TRUE(torch::equal(images.narrow(1, 0, 3), batch.images.to(torch::kHalf))) << "call " << call;
    EXPECT_TRUE(torch::all(images.narrow(1, 3, 1) == 0).item<bool>()) << "call " << call;
  }
  EXPECT_TRUE(graph.captured());
}

}  // namespace
}  // namespace ltrain
