// The trainer's parts that decide alone, without a run: early stopping on given evaluations, the
// progress a checkpoint carries (its JSON round trip and its one-line error on a damaged file),
// and a run's length. They are private to engine: their headers are included from src/engine/.
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "../src/engine/early_stopping.h"
#include "../src/engine/resume.h"
#include "ltrain/config/config.h"
#include "ltrain/core/errors.h"

namespace ltrain::engine {
namespace {

config::RunSection early_stop_settings(config::BestMetric metric, int64_t patience, double min_delta) {
  config::RunSection run;
  run.early_stop_metric = metric;
  run.early_stop_patience = patience;
  run.early_stop_min_delta = min_delta;
  return run;
}

EvalResult with_loss(double loss) { return EvalResult{loss, 0.0, 0, 0}; }
EvalResult with_accuracy(double accuracy) { return EvalResult{0.0, accuracy, 0, 0}; }

TEST(EarlyStopping, TestLossMustFallByMoreThanMinDeltaWithinThePatience) {
  EarlyStopping stopping(early_stop_settings(config::BestMetric::test_loss, 2, 0.01));
  stopping.record(1, with_loss(1.0));  // the first evaluation is the best
  EXPECT_EQ(stopping.standing().best_epoch, 1);
  EXPECT_FALSE(stopping.due());
  stopping.record(2, with_loss(0.995));  // a fall of 0.005: no improvement
  EXPECT_EQ(stopping.standing().evaluations_without_improvement, 1);
  EXPECT_DOUBLE_EQ(stopping.standing().best, 1.0);
  EXPECT_FALSE(stopping.due());
  stopping.record(3, with_loss(0.98));  // a fall of 0.02: the new best, the count starts again
  EXPECT_DOUBLE_EQ(stopping.standing().best, 0.98);
  EXPECT_EQ(stopping.standing().best_epoch, 3);
  EXPECT_EQ(stopping.standing().evaluations_without_improvement, 0);
  stopping.record(4, with_loss(1.5));  // a rise
  EXPECT_FALSE(stopping.due());
  stopping.record(5, with_loss(0.975));
  EXPECT_TRUE(stopping.due());
  EXPECT_EQ(stopping.standing().best_epoch, 3);
  EXPECT_EQ(stopping.stop_text(5, 10),
            "early stop after epoch 5 of 10: test_loss has not improved on its best, 0.9800 at epoch 3, by more "
            "than 0.01 in 2 evaluations");
}

TEST(EarlyStopping, TestAccuracyMustRiseAndIsNamedInPercent) {
  EarlyStopping stopping(early_stop_settings(config::BestMetric::test_acc, 1, 0.0));
  stopping.record(1, with_accuracy(0.15));
  stopping.record(2, with_accuracy(0.189));  // any rise beats a min_delta of 0
  EXPECT_FALSE(stopping.due());
  stopping.record(3, with_accuracy(0.189));  // the same value is no rise
  EXPECT_TRUE(stopping.due());
  EXPECT_EQ(stopping.stop_text(3, 4),
            "early stop after epoch 3 of 4: test_acc has not improved on its best, 18.90% at epoch 2, by more than "
            "0 in 1 evaluations");
}

TEST(EarlyStopping, ANanLossIsNoImprovement) {
  EarlyStopping stopping(early_stop_settings(config::BestMetric::test_loss, 1, 0.0));
  stopping.record(1, with_loss(2.0));
  stopping.record(2, with_loss(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_DOUBLE_EQ(stopping.standing().best, 2.0);
  EXPECT_TRUE(stopping.due());
}

TEST(EarlyStopping, WithoutAMetricItCountsNothingAndNeverStops) {
  EarlyStopping stopping(early_stop_settings(config::BestMetric::none, 1, 0.0));
  for (int64_t epoch = 1; epoch <= 5; ++epoch) stopping.record(epoch, with_loss(1.0));
  EXPECT_EQ(stopping.standing().best_epoch, 0);
  EXPECT_EQ(stopping.standing().evaluations_without_improvement, 0);
  EXPECT_FALSE(stopping.due());
}

TEST(EarlyStopping, AResumedCountGoesOnAndAGrownPatienceLetsTheRunContinue) {
  const EarlyStopping::Standing standing{0.5, 3, 2};  // two evaluations without improvement
  EXPECT_TRUE(EarlyStopping(early_stop_settings(config::BestMetric::test_loss, 2, 0.0), standing).due());
  EarlyStopping patient(early_stop_settings(config::BestMetric::test_loss, 3, 0.0), standing);
  EXPECT_FALSE(patient.due());
  patient.record(6, with_loss(0.6));
  EXPECT_TRUE(patient.due());
  EXPECT_EQ(patient.standing().best_epoch, 3);
}

/// A checkpoint at `step` whose progress is `progress`, as read from `file`.
FoundCheckpoint checkpoint_with(const nlohmann::json& progress, int64_t step, int64_t epoch_steps_done = 0) {
  FoundCheckpoint found;
  found.file = "runs/a/checkpoints/step-00000010.ltc";
  found.checkpoint.meta.step = step;
  found.checkpoint.meta.epoch_steps_done = epoch_steps_done;
  found.checkpoint.meta.progress = progress;
  return found;
}

TEST(ResumeState, ProgressJsonRoundTripsEveryValueExactlyInfAndNanIncluded) {
  RunningSums sums;
  sums.epoch.loss_sum = 0.1 + 0.2;  // not 0.3: the JSON text must keep every bit
  sums.epoch.correct = 17;
  sums.epoch.images = 64;
  sums.epoch_seconds = 1.0 / 3.0;
  sums.train_seconds = 12.5;
  sums.wall_seconds = 20.25;
  sums.final_test_accuracy = 0.4375;
  sums.final_test_loss = std::numeric_limits<double>::infinity();  // a diverged run's
  sums.best_test_accuracy = 0.5;
  sums.best_epoch = 2;
  sums.best_metric = -std::numeric_limits<double>::infinity();
  sums.has_best_metric = true;
  sums.last_scale = 32768.0;
  sums.skipped_steps = 3;
  const EarlyStopping::Standing early_stop{std::numeric_limits<double>::quiet_NaN(), 2, 1};
  // Through the text a checkpoint keeps.
  const nlohmann::json progress = nlohmann::json::parse(progress_json(sums, early_stop, true).dump());
  const ResumeState state = read_resume_state(checkpoint_with(progress, 10), 4);
  EXPECT_EQ(state.sums.epoch.loss_sum, 0.1 + 0.2);
  EXPECT_EQ(state.sums.epoch.correct, 17);
  EXPECT_EQ(state.sums.epoch.images, 64);
  EXPECT_EQ(state.sums.epoch_seconds, 1.0 / 3.0);
  EXPECT_EQ(state.sums.train_seconds, 12.5);
  EXPECT_EQ(state.sums.wall_seconds, 20.25);
  EXPECT_EQ(state.sums.final_test_accuracy, 0.4375);
  EXPECT_EQ(state.sums.final_test_loss, std::numeric_limits<double>::infinity());
  EXPECT_EQ(state.sums.best_test_accuracy, 0.5);
  EXPECT_EQ(state.sums.best_epoch, 2);
  EXPECT_EQ(state.sums.best_metric, -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(state.sums.has_best_metric);
  EXPECT_EQ(state.sums.last_scale, 32768.0);
  EXPECT_EQ(state.sums.skipped_steps, 3);
  EXPECT_TRUE(std::isnan(state.early_stop.best));
  EXPECT_EQ(state.early_stop.best_epoch, 2);
  EXPECT_EQ(state.early_stop.evaluations_without_improvement, 1);
  // Step 10 at 4 steps per epoch, after its epoch's end: epoch 3 with 2 of its steps done.
  EXPECT_EQ(state.point.step, 10);
  EXPECT_EQ(state.point.epoch, 3);
  EXPECT_EQ(state.point.index, 2);
  EXPECT_TRUE(state.point.epoch_ended);
}

TEST(ResumeState, TheLastStepOfAnEpochBeforeItsEvaluationResumesWithThatEvaluation) {
  const nlohmann::json before_evaluation = progress_json(RunningSums{}, {}, false);
  const ResumePoint pending = read_resume_state(checkpoint_with(before_evaluation, 8), 4).point;
  EXPECT_EQ(pending.epoch, 2);
  EXPECT_EQ(pending.index, 4);  // all its steps done: the loop evaluates it
  EXPECT_FALSE(pending.epoch_ended);
  const ResumePoint after_evaluation = read_resume_state(checkpoint_with(progress_json({}, {}, true), 8), 4).point;
  EXPECT_EQ(after_evaluation.epoch, 3);
  EXPECT_EQ(after_evaluation.index, 0);
  EXPECT_TRUE(after_evaluation.epoch_ended);
  // Checkpoints of earlier versions do not say: at an epoch boundary its end came.
  const ResumePoint earlier = read_resume_state(checkpoint_with(nlohmann::json::object(), 8, 0), 4).point;
  EXPECT_EQ(earlier.epoch, 3);
  EXPECT_TRUE(earlier.epoch_ended);
  const ResumePoint mid_epoch = read_resume_state(checkpoint_with(nlohmann::json::object(), 6, 2), 4).point;
  EXPECT_EQ(mid_epoch.epoch, 2);
  EXPECT_EQ(mid_epoch.index, 2);
  EXPECT_FALSE(mid_epoch.epoch_ended);
}

TEST(ResumeState, ADamagedProgressIsOneLineNamingTheFile) {
  const std::string expected =
      "runs/a/checkpoints/step-00000010.ltc: its training progress holds a value of the wrong type; use an earlier "
      "checkpoint";
  nlohmann::json wrong_count = progress_json({}, {}, true);
  wrong_count["epoch_correct"] = "many";
  nlohmann::json wrong_flag = progress_json({}, {}, true);
  wrong_flag["epoch_ended"] = 1;
  nlohmann::json wrong_early_stop = progress_json({}, {}, true);
  wrong_early_stop["early_stop_best_epoch"] = nlohmann::json::array();
  for (const nlohmann::json& progress : {wrong_count, wrong_flag, wrong_early_stop, nlohmann::json::array({1, 2})}) {
    try {
      read_resume_state(checkpoint_with(progress, 10), 4);
      ADD_FAILURE() << "no error for " << progress.dump();
    } catch (const DataError& error) {
      EXPECT_EQ(std::string(error.what()), expected) << progress.dump();
    }
  }
}

TEST(RunLength, EpochsOrMaxStepsSetTheEndAndNameIt) {
  config::RunConfig config;
  config.run.epochs = 3;
  config.run.max_steps = 0;
  const RunLength by_epochs = run_length(config, 78);
  EXPECT_EQ(by_epochs.total_steps, 234);
  EXPECT_EQ(by_epochs.epochs, 3);
  EXPECT_FALSE(by_epochs.by_max_steps);
  EXPECT_EQ(length_text(config, by_epochs), "run.epochs 3 of 78 steps");
  config.run.max_steps = 100;  // ends in the second epoch
  const RunLength by_max_steps = run_length(config, 78);
  EXPECT_EQ(by_max_steps.total_steps, 100);
  EXPECT_EQ(by_max_steps.epochs, 2);
  EXPECT_TRUE(by_max_steps.by_max_steps);
  EXPECT_EQ(length_text(config, by_max_steps), "run.max_steps 100");
  config.run.max_steps = 500;  // past run.epochs: run.epochs ends the run
  EXPECT_EQ(run_length(config, 78).total_steps, 234);
  EXPECT_FALSE(run_length(config, 78).by_max_steps);
  EXPECT_EQ(epochs_of(0, 78), 0);
  EXPECT_EQ(epochs_of(79, 78), 2);
}

}  // namespace
}  // namespace ltrain::engine
