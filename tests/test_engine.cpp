#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/config/load.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/evaluator.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/saved_model.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/engine/ema.h"
#include "ltrain/engine/lr_finder.h"
#include "ltrain/io/tensor_file.h"
#include "support.h"

namespace ltrain::engine {
namespace {

using ltrain::testing::read_file;
using ltrain::testing::TempDir;

/// A small ResNet-18 on the real mini subset: a few seconds per epoch on two cores.
config::LoadedConfig tiny_run(const TempDir& dir, const std::filesystem::path& data_root,
                              const std::vector<std::string>& extra = {}) {
  return testing::config_from({"run.out_dir=" + dir.path().string(), "run.name=tiny", "run.epochs=3",
                               "run.log_every_steps=10", "run.device=cpu", "model.arch=resnet18", "model.stem=cifar",
                               "model.width=8", "data.root=" + data_root.string(), "data.batch_size=100",
                               "optim.lr=0.05", "schedule.name=onecycle"},
                              extra);
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& file) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(Trainer, ShortRunOnCifarMiniLearns) {
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  TempDir dir;
  const auto before = std::chrono::steady_clock::now();
  const TrainResult result = train(tiny_run(dir, root));
  const double call_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  EXPECT_EQ(result.epochs, 3);
  EXPECT_EQ(result.steps, 3 * 50);  // 5000 images, batch 100, drop_last
  EXPECT_GT(result.final_test_accuracy, 0.25) << "chance is 0.10";

  const auto rows = read_jsonl(result.run_dir / "metrics.jsonl");
  std::vector<double> epoch_losses;
  for (const auto& row : rows)
    if (row["kind"] == "epoch") epoch_losses.push_back(row["train_loss"].get<double>());
  ASSERT_EQ(epoch_losses.size(), 3u);
  EXPECT_LT(epoch_losses.back(), epoch_losses.front() - 0.1);

  // The run directory holds what the loop promised.
  for (const char* name : {"config.json", "train.log", "metrics.csv", "metrics.jsonl", "summary.json"})
    EXPECT_TRUE(std::filesystem::exists(result.run_dir / name)) << name;
  EXPECT_EQ(config::load_json(nlohmann::json::parse(read_file(result.run_dir / "config.json")), "saved")
                .config.model.width,
            8);
  EXPECT_NE(read_file(result.run_dir / "train.log").find(" settings differ from the defaults:"), std::string::npos);
  // summary.json: the result, with the device's peak memory (unknown, null, on the CPU), and this
  // process's share of the run (all of it, in a run that did not resume).
  const nlohmann::json summary = nlohmann::json::parse(read_file(result.run_dir / "summary.json"));
  EXPECT_EQ(summary["steps"], 150);
  EXPECT_DOUBLE_EQ(summary["final_test_accuracy"].get<double>(), result.final_test_accuracy);
  EXPECT_TRUE(summary["peak_memory_bytes"].is_null());
  EXPECT_TRUE(summary["peak_reserved_bytes"].is_null());
  EXPECT_EQ(summary["this_process"]["resumed_at_step"], 0);
  EXPECT_EQ(summary["this_process"]["steps"], 150);
  EXPECT_DOUBLE_EQ(summary["this_process"]["train_seconds"].get<double>(), summary["train_seconds"].get<double>());
  EXPECT_DOUBLE_EQ(summary["this_process"]["wall_seconds"].get<double>(), summary["wall_seconds"].get<double>());
  // The set-up before the first step is timed apart from the run; the two fit in the call.
  EXPECT_DOUBLE_EQ(summary["startup_seconds"].get<double>(), result.startup_seconds);
  EXPECT_GT(result.startup_seconds, 0.0);
  EXPECT_LE(result.startup_seconds + result.wall_seconds, call_seconds);
  EXPECT_NE(read_file(result.run_dir / "train.log").find("; set-up before them "), std::string::npos);

  // keep_last 3: one checkpoint per epoch, all kept; evaluating the last one reproduces the run's
  // own final evaluation exactly.
  const auto last = result.run_dir / "checkpoints" / checkpoint_file_name(150);
  ASSERT_TRUE(std::filesystem::exists(last));
  const Checkpoint checkpoint = read_checkpoint(last);
  EXPECT_EQ(checkpoint.meta.epoch, 3);
  EXPECT_EQ(checkpoint.meta.step, 150);
  EXPECT_FALSE(checkpoint.optimizer.empty());
  const auto loaded = config::load_json(checkpoint.meta.config, "checkpoint");
  models::ResNet model = build_model(loaded, torch::kCPU);
  load_state_dict(*model, checkpoint.model, last.string());
  const auto sets = load_data(loaded.config, torch::kCPU);
  const data::EvalLoader test_loader(sets.test, eval_loader_options(loaded.config.data));
  const EvalResult again = evaluate(model, test_loader, loaded.config);
  EXPECT_EQ(again.images, 1000);
  EXPECT_DOUBLE_EQ(again.accuracy, result.final_test_accuracy);
}

TEST(Evaluator, FlipAverageScoresTheMeanLogitsOfEachImageAndItsMirror) {
  // 50 test images in batches of 20: the last batch is partial.
  const auto loaded = testing::config_from(
      {"run.device=cpu", "model.arch=resnet18", "model.stem=cifar", "model.width=8", "data.source=synthetic",
       "data.synthetic_train_size=64", "data.synthetic_test_size=50", "data.eval_batch_size=20",
       "data.eval_flip_average=true"},
      {});
  torch::manual_seed(0);
  models::ResNet model = build_model(loaded, torch::kCPU);
  const auto sets = load_data(loaded.config, torch::kCPU);
  const data::EvalLoader loader(sets.test, eval_loader_options(loaded.config.data));
  const EvalResult flipped = evaluate(model, loader, loaded.config);

  model->eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t index = 0; index < loader.num_batches(); ++index) {
    const data::Batch batch = loader.batch(index);
    const torch::Tensor logits = 0.5 * (model->forward(batch.images) + model->forward(batch.images.flip({3})));
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, batch.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(batch.labels).sum().item<int64_t>();
  }
  EXPECT_EQ(flipped.images, 50);
  EXPECT_EQ(flipped.correct, correct);
  EXPECT_NEAR(flipped.loss, loss_sum / 50.0, 1e-5);

  // Without the option, one pass: a different loss (the network is not mirror-symmetric).
  config::RunConfig single_pass = loaded.config;
  single_pass.data.eval_flip_average = false;
  EXPECT_GT(std::abs(evaluate(model, loader, single_pass).loss - flipped.loss), 1e-6);
}

TEST(Ema, FollowsTheEmaRuleAndIsSwappedInForEvaluation) {
  const auto loaded = testing::config_from(
      {"run.device=cpu", "model.arch=resnet18", "model.stem=cifar", "model.width=8"}, {});
  models::ResNet model = build_model(loaded, torch::kCPU);
  Ema average(*model, 0.9);
  const NamedTensors state = state_dict(*model);
  const torch::Tensor& weight = find_tensor(state, "conv1.weight")->detach();
  const torch::Tensor& running_mean = find_tensor(state, "bn1.running_mean")->detach();
  const torch::Tensor& counter = find_tensor(state, "bn1.num_batches_tracked")->detach();
  const torch::Tensor weight_before = weight.clone(), mean_before = running_mean.clone();
  {
    torch::NoGradGuard no_grad;
    weight.add_(1.0);
    running_mean.add_(1.0);
    counter.add_(5);
  }
  average.update();  // 0.9 * before + 0.1 * (before + 1) = before + 0.1
  const NamedTensors averaged = average.weights();
  EXPECT_TRUE(torch::allclose(*find_tensor(averaged, "conv1.weight"), weight_before + 0.1, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(*find_tensor(averaged, "bn1.running_mean"), mean_before + 0.1, 1e-6, 1e-6));
  EXPECT_EQ(find_tensor(averaged, "bn1.num_batches_tracked")->item<int64_t>(), 5);  // the model's own
  {
    const Ema::Applied applied(average);
    EXPECT_TRUE(torch::allclose(weight, weight_before + 0.1, 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(running_mean, mean_before + 0.1, 1e-6, 1e-6));
  }
  EXPECT_TRUE(torch::allclose(weight, weight_before + 1.0, 1e-6, 1e-6));  // the model's own values back

  // load: the averaged values of a checkpoint, or a DataError naming what is missing.
  Ema fresh(*model, 0.9);
  fresh.load(averaged, "x.ltc");
  EXPECT_TRUE(torch::equal(*find_tensor(fresh.weights(), "conv1.weight"),
                           *find_tensor(averaged, "conv1.weight")));
  NamedTensors incomplete = averaged;
  incomplete.erase(incomplete.begin());
  EXPECT_THROW(fresh.load(incomplete, "x.ltc"), DataError);
}

TEST(Trainer, WithEmaTheCheckpointsAveragedWeightsAreWhatTheRunEvaluated) {
  TempDir dir;
  const TrainResult result = train(tiny_run(
      dir, "unused",
      {"data.source=synthetic", "data.synthetic_train_size=256", "data.synthetic_test_size=64", "data.batch_size=64",
       "run.epochs=2", "optim.ema_decay=0.8"}));
  const Checkpoint checkpoint = read_checkpoint(result.run_dir / "checkpoints" / checkpoint_file_name(8));
  ASSERT_FALSE(checkpoint.ema_weights.empty());
  EXPECT_EQ(&evaluation_weights(checkpoint), &checkpoint.ema_weights);
  EXPECT_FALSE(torch::equal(*find_tensor(checkpoint.ema_weights, "conv1.weight"),
                            *find_tensor(checkpoint.model, "conv1.weight")));
  const auto loaded = config::load_json(checkpoint.meta.config, "checkpoint");
  models::ResNet model = build_model(loaded, torch::kCPU);
  load_state_dict(*model, evaluation_weights(checkpoint), "checkpoint");
  const auto sets = load_data(loaded.config, torch::kCPU);
  const data::EvalLoader test_loader(sets.test, eval_loader_options(loaded.config.data));
  const EvalResult again = evaluate(model, test_loader, loaded.config);
  EXPECT_NEAR(again.loss, result.final_test_loss, 1e-6);
}

TEST(Trainer, MaxStepsAndKeepLast) {
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  TempDir dir;
  const TrainResult result =
      train(tiny_run(dir, root, {"run.max_steps=12", "data.batch_size=400", "checkpoint.keep_last=1",
                                 "model.stem=imagenet", "schedule.name=constant"}));
  EXPECT_EQ(result.steps, 12);
  EXPECT_EQ(result.epochs, 1);  // 12 steps per epoch of 5000/400
  int checkpoints = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(result.run_dir / "checkpoints"))
    ++checkpoints;
  EXPECT_EQ(checkpoints, 1);
}

TEST(Trainer, SameSeedSameRun) {
  TempDir dir;
  const std::vector<std::string> synthetic{"data.source=synthetic", "data.synthetic_train_size=256",
                                           "data.synthetic_test_size=64", "data.batch_size=64", "run.epochs=1",
                                           "model.stem=imagenet"};
  const TrainResult a = train(tiny_run(dir, "unused", synthetic));
  const TrainResult b = train(tiny_run(dir, "unused", synthetic));
  EXPECT_NE(a.run_dir, b.run_dir);
  const Checkpoint ca = read_checkpoint(a.run_dir / "checkpoints" / checkpoint_file_name(4));
  const Checkpoint cb = read_checkpoint(b.run_dir / "checkpoints" / checkpoint_file_name(4));
  ASSERT_EQ(ca.model.size(), cb.model.size());
  for (size_t i = 0; i < ca.model.size(); ++i) EXPECT_TRUE(torch::equal(ca.model[i].second, cb.model[i].second));
}

TEST(Trainer, Bf16AutocastChannelsLastAccumulationAndCheckpointingOnTheCpu) {
  TempDir dir;
  const TrainResult result = train(tiny_run(
      dir, "unused",
      {"data.source=synthetic", "data.synthetic_train_size=256", "data.synthetic_test_size=64", "data.batch_size=32",
       "run.epochs=2", "precision.mode=bf16", "model.channels_last=true", "optim.accumulation_steps=2",
       "model.checkpoint_segments=2", "optim.clip_grad_norm=1.0", "schedule.name=constant", "optim.lr=0.02"}));
  EXPECT_EQ(result.steps, 2 * 4);  // 256 images / (2 x 32) per step
  EXPECT_TRUE(std::isfinite(result.final_test_loss));
  std::vector<double> losses;
  for (const auto& row : read_jsonl(result.run_dir / "metrics.jsonl"))
    if (row["kind"] == "epoch") losses.push_back(row["train_loss"].get<double>());
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses[1], losses[0]);  // random labels, but a small set is memorized
}

/// A tiny model on a small synthetic set, for what a Run builds.
config::LoadedConfig synthetic_run(const std::vector<std::string>& extra = {}) {
  return testing::config_from({"run.device=cpu", "model.arch=resnet18", "model.stem=cifar", "model.width=4",
                               "data.source=synthetic", "data.synthetic_train_size=64",
                               "data.synthetic_test_size=40", "data.batch_size=16"},
                              extra);
}

TEST(Run, BuildsThePartsItIsAskedFor) {
  engine::Run training(synthetic_run(), RunParts{});
  EXPECT_EQ(training.sets().train.size(), 64);
  EXPECT_EQ(training.train_loader().batches_per_epoch(), 4);
  EXPECT_EQ(training.eval_loader().size(), 40);
  EXPECT_EQ(training.optimizer().groups().front().params.front().data_ptr(),
            training.model()->parameters().front().data_ptr());
  EXPECT_FALSE(training.scaler().enabled());  // fp32: no loss scaling
  EXPECT_EQ(training.group(), nullptr);
  EXPECT_TRUE(training.main_process());

  RunParts evaluation_parts;
  evaluation_parts.training = false;
  engine::Run evaluation(synthetic_run(), evaluation_parts);
  EXPECT_EQ(evaluation.eval_loader().size(), 40);
  EXPECT_THROW(evaluation.train_loader(), std::bad_optional_access);
  EXPECT_THROW(evaluation.optimizer(), std::bad_optional_access);

  RunParts model_only;
  model_only.data = false;
  model_only.training = false;
  engine::Run bare(synthetic_run(), model_only);
  EXPECT_THROW(bare.sets(), std::bad_optional_access);
  EXPECT_GT(models::count_parameters(*bare.model()), 0);
}

/// A one-epoch synthetic run named "log" under `dir`, logging every `log_every_steps`; its train.log
/// as it stood when step 2 ended goes to `seen_at_step_two`.
TrainResult train_reading_the_log_at_step_two(const TempDir& dir, int log_every_steps, std::string& seen_at_step_two) {
  const auto log = dir.path() / "log" / "train.log";
  TrainHooks hooks;
  hooks.after_step = [&](int64_t step) {
    if (step == 2) seen_at_step_two = read_file(log);
  };
  return train(synthetic_run({"run.out_dir=" + dir.path().string(), "run.name=log", "run.epochs=1",
                              "run.log_every_steps=" + std::to_string(log_every_steps)}),
               hooks);
}

TEST(Trainer, TrainLogHoldsEachLineAsItIsLogged) {
  TempDir dir;
  std::string seen_at_step_two;
  train_reading_the_log_at_step_two(dir, 1, seen_at_step_two);
  // What `tail -f` shows during the run: the start-up lines and step 1's line, before step 2 ends.
  EXPECT_NE(seen_at_step_two.find(" settings differ from the defaults:"), std::string::npos) << seen_at_step_two;
  EXPECT_NE(seen_at_step_two.find("step 1/4 | loss "), std::string::npos) << seen_at_step_two;
}

TEST(Trainer, FirstProgressLineComesAfterTheFirstStepNotAtTheFirstLogInterval) {
  TempDir dir;
  std::string seen_at_step_two;
  const TrainResult result = train_reading_the_log_at_step_two(dir, 3, seen_at_step_two);
  EXPECT_NE(seen_at_step_two.find("step 1/4 | loss "), std::string::npos) << seen_at_step_two;
  // The early line reads the sums without taking them: the metrics keep their log intervals.
  std::vector<int64_t> step_rows;
  for (const auto& row : read_jsonl(result.run_dir / "metrics.jsonl"))
    if (row["kind"] == "step") step_rows.push_back(row["step"].get<int64_t>());
  EXPECT_EQ(step_rows, (std::vector<int64_t>{3, 4}));
}

TEST(Trainer, StartUpLinesNameTheSeed) {
  TempDir dir;
  const TrainResult result = train(synthetic_run(
      {"run.out_dir=" + dir.path().string(), "run.name=seed", "run.max_steps=1", "run.seed=1234"}));
  const std::string log = read_file(result.run_dir / "train.log");
  EXPECT_NE(log.find(" CPU threads | seed 1234\n"), std::string::npos) << log;
  EXPECT_EQ(nlohmann::json::parse(read_file(result.run_dir / "config.json"))["run"]["seed"], 1234);
}

TEST(Trainer, EarlyStopEndsTheRunAtAnEpochEndWithACheckpointAndSaysWhy) {
  TempDir dir;
  // No change of the test loss beats a min_delta of 100: the first evaluation is the best, the
  // next two are without improvement, and patience 2 stops the run after epoch 3 of 10.
  const TrainResult result = train(synthetic_run(
      {"run.out_dir=" + dir.path().string(), "run.name=early", "run.epochs=10", "run.early_stop_metric=test_loss",
       "run.early_stop_patience=2", "run.early_stop_min_delta=100", "checkpoint.every_epochs=0"}));
  EXPECT_TRUE(result.stopped_early);
  EXPECT_EQ(result.epochs, 3);
  EXPECT_EQ(result.steps, 3 * 4);
  // Checkpointed as at a normal end, though checkpoint.every_epochs asks for none before it.
  EXPECT_TRUE(std::filesystem::exists(result.run_dir / "checkpoints" / checkpoint_file_name(12)));
  const std::string log = read_file(result.run_dir / "train.log");
  // One best of the test loss, named as such, in the early stop's line and in the last; the best
  // accuracy beside it says it is the accuracy's.
  const auto row = read_jsonl(result.run_dir / "metrics.jsonl");
  double first_loss = 0.0;
  for (const auto& r : row)
    if (r["kind"] == "epoch" && r["epoch"] == 1) first_loss = r["test_loss"].get<double>();
  const std::string best = fmt::format("{:.4f}", first_loss);
  EXPECT_NE(log.find("early stop after epoch 3 of 10: test_loss has not improved on its best, " + best +
                     " at epoch 1, by more than 100 in 2 evaluations\n"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(" (best " + best + ", epoch 1) | "), std::string::npos) << log;
  EXPECT_NE(log.find(" | test accuracy "), std::string::npos) << log;
  EXPECT_EQ(log.find(", best "), std::string::npos) << log;
  EXPECT_EQ(nlohmann::json::parse(read_file(result.run_dir / "summary.json"))["stopped_early"], true);
  // Resumed from there, the run stays stopped.
  const TrainResult resumed = train(synthetic_run(
      {"run.out_dir=" + dir.path().string(), "run.name=early", "run.epochs=10", "run.early_stop_metric=test_loss",
       "run.early_stop_patience=2", "run.early_stop_min_delta=100", "checkpoint.resume=auto"}));
  EXPECT_EQ(resumed.steps, 12);
  EXPECT_TRUE(resumed.stopped_early);
}

TEST(LrFind, RampsTheLrExponentiallyAndSuggestsOneInTheRange) {
  LrFindOptions options;
  options.steps = 12;
  options.start_lr = 1e-4;
  options.end_lr = 1.0;
  const LrFindResult result = find_lr(synthetic_run({"optim.momentum=0"}), options);
  ASSERT_GE(result.points.size(), 3u);
  EXPECT_DOUBLE_EQ(result.points[0].lr, 1e-4);
  for (size_t i = 1; i < result.points.size(); ++i) {
    EXPECT_EQ(result.points[i].step, static_cast<int64_t>(i) + 1);
    EXPECT_NEAR(result.points[i].lr / result.points[i - 1].lr, std::pow(1e4, 1.0 / 11.0), 1e-9);
    EXPECT_TRUE(std::isfinite(result.points[i].loss));
  }
  if (!result.diverged) {
    EXPECT_NEAR(result.points.back().lr, 1.0, 1e-12);
  }
  EXPECT_GE(result.suggested_lr, 1e-5);
  EXPECT_LE(result.suggested_lr, 1.0);
  options.end_lr = options.start_lr;
  EXPECT_THROW(find_lr(synthetic_run(), options), ConfigError);
}

TEST(LrSuggestion, SteepestFallOfTheSmoothedLossBeforeItsLowest) {
  // Falls slowly, then fast between 1e-3 and 1e-2, lowest at 1e-1, then rises.
  const std::vector<LrFindPoint> points{{1, 1e-5, 0, 2.30}, {2, 1e-4, 0, 2.28}, {3, 1e-3, 0, 2.20},
                                        {4, 1e-2, 0, 1.50}, {5, 1e-1, 0, 1.20}, {6, 1.0, 0, 3.00}};
  EXPECT_DOUBLE_EQ(suggest_lr(points), 1e-2);
  // Lowest at once: a tenth of its lr.
  EXPECT_DOUBLE_EQ(suggest_lr({{1, 1e-3, 0, 1.0}, {2, 1e-2, 0, 2.0}, {3, 1e-1, 0, 5.0}}), 1e-4);
  // A ramp of 100 points, 1e-7 to 10, whose first points fall faster than the loss later falls
  // (their average is of a few noisy steps): they are left out, and the suggestion lies in the
  // real fall, between points 70 and 85, not at 1e-7.
  std::vector<LrFindPoint> ramp;
  for (int i = 0; i < 100; ++i) {
    const double lr = 1e-7 * std::pow(1e8, i / 99.0);
    double loss = 2.30;
    if (i < 5) loss = 3.0 - 0.15 * i;
    if (i >= 70 && i < 85) loss = 2.30 - 0.08 * (i - 69);
    if (i >= 85) loss = 1.10 + 0.2 * (i - 84);
    ramp.push_back({i + 1, lr, loss, loss});
  }
  const double suggested = suggest_lr(ramp);
  EXPECT_GE(suggested, ramp[70].lr);
  EXPECT_LE(suggested, ramp[84].lr);
}

TEST(Trainer, PlanRunReportsWhatARunWouldBuildAndWritesNothing) {
  TempDir dir;
  const auto out_dir = dir.path() / "runs";
  const std::vector<std::string> settings{"run.out_dir=" + out_dir.string(), "run.name=plan", "run.max_steps=3",
                                          "optim.accumulation_steps=2"};
  const config::LoadedConfig loaded = synthetic_run(settings);
  const RunPlan plan = plan_run(loaded);
  EXPECT_EQ(plan.device, "cpu");
  EXPECT_EQ(plan.train_images, 64);
  EXPECT_EQ(plan.test_images, 40);
  EXPECT_EQ(plan.images_per_step, 32);  // 2 accumulated micro-batches of 16
  EXPECT_EQ(plan.steps_per_epoch, 2);
  EXPECT_EQ(plan.total_steps, 3);  // run.max_steps cuts the 10 epochs short
  EXPECT_EQ(plan.epochs, 2);
  EXPECT_EQ(plan.parameters, models::count_parameters(*engine::Run(loaded, RunParts{}).model()));
  EXPECT_TRUE(plan.resume_from.empty());
  EXPECT_EQ(to_text(loaded.config, plan),
            fmt::format("resnet18 (cifar stem, width 4): {} parameters | synthetic: 64 training, 40 test images | 2 "
                        "steps per epoch of 32 images, 3 steps in 2 epoch(s) | device cpu",
                        plan.parameters));
  EXPECT_FALSE(std::filesystem::exists(out_dir));

  // checkpoint.resume: the checkpoint is read and named, and still nothing is written.
  std::vector<std::string> one_step = settings;
  one_step.push_back("run.max_steps=1");
  const TrainResult trained = train(synthetic_run(one_step));
  const auto checkpoint = trained.run_dir / "checkpoints" / checkpoint_file_name(1);
  std::vector<std::string> resumed = settings;
  resumed.push_back("checkpoint.resume=" + checkpoint.string());
  const RunPlan again = plan_run(synthetic_run(resumed));
  EXPECT_EQ(again.resume_from, checkpoint);
  EXPECT_EQ(again.resume_step, 1);
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(out_dir)) ++entries;
  EXPECT_EQ(entries, 1);  // the one run's folder
}

TEST(Run, CallerLoadedWeightsSkipInitFrom) {
  // model.init_from naming no file stops a run, unless the caller loads the weights itself (a
  // resumed run, an evaluated checkpoint).
  const config::LoadedConfig loaded = synthetic_run({"model.init_from=/nonexistent/weights.safetensors"});
  RunParts parts;
  parts.training = false;
  EXPECT_THROW(engine::Run(loaded, parts), ConfigError);
  parts.weights_from_caller = true;
  engine::Run run(loaded, parts);
  EXPECT_EQ(run.config().model.init_from, "/nonexistent/weights.safetensors");  // kept for the record
}

TEST(SavedModel, ExportMetadataNamesTheModelAndTheInputScaling) {
  Checkpoint checkpoint;
  checkpoint.meta.step = 42;
  checkpoint.meta.config = config::to_json(synthetic_run({"model.width=8", "data.normalize=true"}).config);
  const std::map<std::string, std::string> metadata = export_metadata(checkpoint, "runs/a/step-42.ltc");
  EXPECT_EQ(metadata.at("format"), "pt");
  EXPECT_EQ(metadata.at("step"), "42");
  EXPECT_EQ(metadata.at("source_checkpoint"), "runs/a/step-42.ltc");
  EXPECT_EQ(metadata.at("model.arch"), "resnet18");
  EXPECT_EQ(metadata.at("model.width"), "8");
  EXPECT_EQ(metadata.at("data.normalize"), "true");
  EXPECT_EQ(nlohmann::json::parse(metadata.at("data.mean")).size(), 3u);
  EXPECT_EQ(metadata.count("data.batch_size"), 0u);  // only what a reader needs to feed the model
}

TEST(Checkpoint, LoadStateDictNamesTheMismatch) {
  config::ModelSection small;
  small.arch = config::Arch::resnet18;
  small.width = 4;
  models::ResNet model(resnet_options(small));
  NamedTensors tensors = state_dict(*model);
  tensors.back().second = torch::zeros({3});  // fc.bias with the wrong number of classes
  try {
    load_state_dict(*model, tensors, "w.safetensors");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "w.safetensors: tensor \"fc.bias\" has shape [3], the model expects [10] (check model.num_classes and "
              "model.width)");
  }
  tensors.pop_back();
  EXPECT_THROW(load_state_dict(*model, tensors, "w"), DataError);
}

TEST(Checkpoint, StateDictOrderIsPyTorchs) {
  config::ModelSection small;
  small.arch = config::Arch::resnet18;
  small.width = 4;
  models::ResNet model(resnet_options(small));
  const NamedTensors state = state_dict(*model);
  ASSERT_GE(state.size(), 7u);
  const std::vector<std::string> first{"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                       "bn1.running_var", "bn1.num_batches_tracked", "layer1.0.conv1.weight"};
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(state[i].first, first[i]);
  EXPECT_EQ(state.back().first, "fc.bias");
}


/// A config whose every key that a module's options hold differs from the section's default.
config::RunConfig config_off_the_defaults() {
  config::RunConfig c;
  c.data.source = config::DataSource::cifar100;
  c.data.root = "elsewhere/cifar";
  c.data.cifar100_labels = config::Cifar100Labels::coarse;
  c.data.image_size = 48;
  c.data.synthetic_train_size = 300;
  c.data.synthetic_test_size = 70;
  c.model.arch = config::Arch::resnext50_32x4d;
  c.model.stem = config::Stem::cifar;
  c.model.num_classes = 7;
  c.model.width = 12;
  c.model.zero_init_residual = true;
  c.model.checkpoint_segments = 3;
  c.model.ltrain_batch_norm = false;
  c.model.cudnn_batch_norm = false;
  c.model.ltrain_max_pool = false;
  c.model.fused_conv = true;
  c.optim.name = config::OptimizerKind::adamw;
  c.optim.momentum = 0.8;
  c.optim.nesterov = true;
  c.optim.weight_decay = 0.05;
  c.optim.no_decay_norm_and_bias = true;
  c.optim.betas = {0.85, 0.95};
  c.optim.eps = 1e-6;
  c.optim.fused = false;
  c.schedule.name = config::ScheduleKind::onecycle;
  c.schedule.warmup_epochs = 1.5;
  c.schedule.warmup_start_factor = 0.2;
  c.schedule.milestones = {3, 6};
  c.schedule.gamma = 0.5;
  c.schedule.min_lr = 0.001;
  c.schedule.pct_start = 0.4;
  c.schedule.div_factor = 10;
  c.schedule.final_div_factor = 100;
  c.distributed.backend = config::DistBackend::gloo;
  c.distributed.timeout_s = 42;
  c.precision.mode = config::PrecisionMode::fp16;
  c.precision.loss_scale_init = 1024;
  c.precision.loss_scale_growth_factor = 4;
  c.precision.loss_scale_backoff_factor = 0.25;
  c.precision.loss_scale_growth_interval = 100;
  return c;
}

/// Each field of each module's options holds the key of the same name, read back from `c`.
void expect_options_follow(const config::RunConfig& c) {
  const data::SourceOptions source = source_options(c.data);
  EXPECT_EQ(source.source, c.data.source);
  EXPECT_EQ(source.root, std::filesystem::path(c.data.root));
  EXPECT_EQ(source.cifar100_labels, c.data.cifar100_labels);
  EXPECT_EQ(source.image_size, c.data.image_size);
  EXPECT_EQ(source.synthetic_train_size, c.data.synthetic_train_size);
  EXPECT_EQ(source.synthetic_test_size, c.data.synthetic_test_size);

  const models::ResNetOptions model = resnet_options(c.model);
  EXPECT_EQ(model.arch, c.model.arch);
  EXPECT_EQ(model.stem, c.model.stem);
  EXPECT_EQ(model.num_classes, c.model.num_classes);
  EXPECT_EQ(model.width, c.model.width);
  EXPECT_EQ(model.zero_init_residual, c.model.zero_init_residual);
  EXPECT_EQ(model.checkpoint_segments, c.model.checkpoint_segments);
  EXPECT_EQ(model.ltrain_batch_norm, c.model.ltrain_batch_norm);
  EXPECT_EQ(model.cudnn_batch_norm, c.model.cudnn_batch_norm);
  EXPECT_EQ(model.ltrain_max_pool, c.model.ltrain_max_pool);
  EXPECT_EQ(model.fused_conv, c.model.fused_conv);

  const optim::OptimizerOptions optimizer = optimizer_options(c.optim);
  EXPECT_EQ(optimizer.name, c.optim.name);
  EXPECT_EQ(optimizer.momentum, c.optim.momentum);
  EXPECT_EQ(optimizer.nesterov, c.optim.nesterov);
  EXPECT_EQ(optimizer.weight_decay, c.optim.weight_decay);
  EXPECT_EQ(optimizer.no_decay_norm_and_bias, c.optim.no_decay_norm_and_bias);
  EXPECT_EQ(std::vector<double>(optimizer.betas.begin(), optimizer.betas.end()), c.optim.betas);
  EXPECT_EQ(optimizer.eps, c.optim.eps);
  EXPECT_EQ(optimizer.fused, c.optim.fused);

  const optim::ScheduleOptions schedule = schedule_options(c.schedule);
  EXPECT_EQ(schedule.name, c.schedule.name);
  EXPECT_EQ(schedule.warmup_epochs, c.schedule.warmup_epochs);
  EXPECT_EQ(schedule.warmup_start_factor, c.schedule.warmup_start_factor);
  EXPECT_EQ(schedule.milestones, c.schedule.milestones);
  EXPECT_EQ(schedule.gamma, c.schedule.gamma);
  EXPECT_EQ(schedule.min_lr, c.schedule.min_lr);
  EXPECT_EQ(schedule.pct_start, c.schedule.pct_start);
  EXPECT_EQ(schedule.div_factor, c.schedule.div_factor);
  EXPECT_EQ(schedule.final_div_factor, c.schedule.final_div_factor);

  const dist::GroupOptions group = group_options(c.distributed);
  EXPECT_EQ(group.backend, c.distributed.backend);
  EXPECT_EQ(group.timeout_s, c.distributed.timeout_s);

  const amp::GradScalerOptions scaler = grad_scaler_options(c.precision);
  EXPECT_EQ(scaler.enabled, c.precision.mode == config::PrecisionMode::fp16);
  EXPECT_EQ(scaler.init_scale, c.precision.loss_scale_init);
  EXPECT_EQ(scaler.growth_factor, c.precision.loss_scale_growth_factor);
  EXPECT_EQ(scaler.backoff_factor, c.precision.loss_scale_backoff_factor);
  EXPECT_EQ(scaler.growth_interval, c.precision.loss_scale_growth_interval);
}

TEST(ModuleOptions, HoldEveryKeyOfTheirSection) {
  // The defaults and a config off every default: a field left unfilled, or filled from another
  // key, shows in one of the two.
  expect_options_follow(config::RunConfig{});
  expect_options_follow(config_off_the_defaults());
}

TEST(ModuleOptions, PrecisionPlanFollowsTheMode) {
  config::PrecisionSection precision;
  const auto plan = [&](config::PrecisionMode mode, bool tf32) {
    precision.mode = mode;
    precision.tf32 = tf32;
    return precision_plan(precision);
  };
  const amp::PrecisionPlan fp32 = plan(config::PrecisionMode::fp32, false);
  EXPECT_FALSE(fp32.autocast || fp32.grad_scaler || fp32.tf32);
  EXPECT_TRUE(plan(config::PrecisionMode::fp32, true).tf32);
  const amp::PrecisionPlan tf32 = plan(config::PrecisionMode::tf32, false);
  EXPECT_TRUE(tf32.tf32);
  EXPECT_FALSE(tf32.autocast || tf32.grad_scaler);
  const amp::PrecisionPlan fp16 = plan(config::PrecisionMode::fp16, false);
  EXPECT_TRUE(fp16.autocast && fp16.grad_scaler);
  EXPECT_EQ(fp16.dtype, torch::kFloat16);
  EXPECT_FALSE(fp16.tf32);
  const amp::PrecisionPlan bf16 = plan(config::PrecisionMode::bf16, false);
  EXPECT_TRUE(bf16.autocast);
  EXPECT_FALSE(bf16.grad_scaler || bf16.tf32);
  EXPECT_EQ(bf16.dtype, torch::kBFloat16);
  EXPECT_FALSE(grad_scaler_options(precision).enabled);  // bf16: no GradScaler
}

}  // namespace
}  // namespace ltrain::engine
