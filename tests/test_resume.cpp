// Full-state checkpoints: exact resume (mid-epoch and at an epoch boundary), signals, damaged
// files, keep_last and best, weights in (model.init_from).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/io/tensor_file.h"
#include "support.h"

namespace ltrain::engine {
namespace {

namespace fs = std::filesystem;
using ltrain::testing::LtrainProcess;
using ltrain::testing::read_file;
using ltrain::testing::TempDir;
using ltrain::testing::wait_until;

/// 256 synthetic images in steps of 32: 8 steps per epoch, 24 in all; deterministic algorithms,
/// momentum, a one-cycle schedule (its LR depends on the step), checkpoints every 3 steps.
config::LoadedConfig resumable_run(const fs::path& out_dir, const std::string& name,
                                   const std::vector<std::string>& extra = {}) {
  return testing::config_from(
      {"run.out_dir=" + out_dir.string(), "run.name=" + name, "run.epochs=3", "run.log_every_steps=2",
       "run.device=cpu", "run.threads=2", "model.arch=resnet18", "model.stem=cifar", "model.width=8",
       "data.source=synthetic", "data.synthetic_train_size=256", "data.synthetic_test_size=64", "data.batch_size=32",
       "optim.lr=0.05", "schedule.name=onecycle", "precision.deterministic=true", "checkpoint.every_steps=3",
       "checkpoint.keep_last=20"},
      extra);
}

std::vector<nlohmann::json> metrics_rows(const fs::path& run_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row["kind"] == "run") continue;  // where each process started: a resumed run has two
    for (const char* timing : {"img_per_s", "elapsed_s"}) row.erase(timing);  // wall-clock values differ
    rows.push_back(row);
  }
  return rows;
}

/// The run's last checkpoint: weights, optimizer state and metrics history equal bitwise.
void expect_same_end(const fs::path& a, const fs::path& b, int64_t last_step) {
  const Checkpoint ca = read_checkpoint(a / "checkpoints" / checkpoint_file_name(last_step));
  const Checkpoint cb = read_checkpoint(b / "checkpoints" / checkpoint_file_name(last_step));
  ASSERT_EQ(ca.model.size(), cb.model.size());
  for (size_t i = 0; i < ca.model.size(); ++i)
    EXPECT_TRUE(torch::equal(ca.model[i].second, cb.model[i].second)) << ca.model[i].first;
  ASSERT_EQ(ca.optimizer.size(), cb.optimizer.size());
  for (size_t i = 0; i < ca.optimizer.size(); ++i)
    EXPECT_TRUE(torch::equal(ca.optimizer[i].second, cb.optimizer[i].second)) << ca.optimizer[i].first;
  ASSERT_EQ(ca.ema_weights.size(), cb.ema_weights.size());
  for (size_t i = 0; i < ca.ema_weights.size(); ++i)
    EXPECT_TRUE(torch::equal(ca.ema_weights[i].second, cb.ema_weights[i].second))
        << ca.ema_weights[i].first;
  EXPECT_EQ(metrics_rows(a), metrics_rows(b));
  const nlohmann::json sa = nlohmann::json::parse(read_file(a / "summary.json"));
  const nlohmann::json sb = nlohmann::json::parse(read_file(b / "summary.json"));
  for (const char* key : {"epochs", "steps", "final_test_accuracy", "final_test_loss", "best_epoch"})
    EXPECT_EQ(sa[key], sb[key]) << key;
}

/// `loaded` as a config file for the ltrain executable.
fs::path write_config_file(const config::LoadedConfig& loaded, const fs::path& file) {
  testing::write_file(file, config::to_json(loaded.config).dump(2));
  return file;
}

/// The step of the last whole row in RUN_DIR/metrics.jsonl (0 when there is none).
int64_t last_logged_step(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  int64_t step = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object()) step = row.value("step", step);
  }
  return step;
}

/// Files below `root` whose names hold ".tmp" (unfinished atomic writes).
std::vector<fs::path> temporary_files(const fs::path& root) {
  std::vector<fs::path> found;
  for (const fs::path& folder : {root, root / "checkpoints"}) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(folder, error))
      if (entry.path().filename().string().find(".tmp") != std::string::npos) found.push_back(entry.path());
  }
  return found;
}

/// How often `text` holds `part`.
size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

/// Trains `loaded`, sending this process SIGTERM right after step `stop_step`; expects the run
/// to stop there with Interrupted (exit code 130) after writing its checkpoint.
void train_until_signal(const config::LoadedConfig& loaded, int64_t stop_step) {
  TrainHooks hooks;
  hooks.after_step = [stop_step](int64_t step) {
    if (step == stop_step) std::raise(SIGTERM);
  };
  try {
    train(loaded, hooks);
    FAIL() << "the run did not stop on SIGTERM";
  } catch (const Interrupted& stopped) {
    EXPECT_EQ(stopped.code(), ExitCode::interrupted);
    EXPECT_NE(std::string(stopped.what()).find("checkpoint.resume=auto"), std::string::npos) << stopped.what();
  }
}

TEST(Resume, InterruptedMidEpochThenResumedMatchesAnUninterruptedRun) {
  TempDir dir;
  for (const std::vector<std::string>& variant :
       {std::vector<std::string>{},
        {"precision.mode=bf16", "optim.accumulation_steps=2", "data.batch_size=16", "optim.name=adamw",
         "optim.lr=0.002"},
        {"optim.ema_decay=0.9"},
        // Step 10 falls in the second of two epochs of progressive resizing (16, 24, then 32).
        {"data.progressive_start_size=16", "data.progressive_epochs=2", "data.progressive_size_step=8"}}) {
    const TrainResult whole = train(resumable_run(dir.path(), "whole", variant));
    ASSERT_EQ(whole.steps, 24);
    // Step 10 is the second step of epoch 2, between two steps checkpoints (9 and 12).
    train_until_signal(resumable_run(dir.path(), "split", variant), 10);
    const fs::path split_dir = dir.path() / "split";
    ASSERT_TRUE(fs::exists(split_dir / "checkpoints" / checkpoint_file_name(10)));
    EXPECT_FALSE(fs::exists(split_dir / "summary.json"));
    const Checkpoint stopped = read_checkpoint(split_dir / "checkpoints" / checkpoint_file_name(10));
    EXPECT_EQ(stopped.meta.epoch, 1);
    EXPECT_EQ(stopped.meta.epoch_steps_done, 2);

    std::vector<std::string> resume = variant;
    resume.push_back("checkpoint.resume=auto");
    const TrainResult resumed = train(resumable_run(dir.path(), "split", resume));
    EXPECT_EQ(resumed.run_dir, split_dir);
    EXPECT_EQ(resumed.steps, 24);
    expect_same_end(whole.run_dir, split_dir, 24);
    const bool averaged = std::find(variant.begin(), variant.end(), "optim.ema_decay=0.9") != variant.end();
    EXPECT_EQ(read_checkpoint(split_dir / "checkpoints" / checkpoint_file_name(24)).ema_weights.empty(), !averaged);
    EXPECT_NE(read_file(split_dir / "train.log").find("resuming from"), std::string::npos);
    if (variant.size() == 3 && variant[0] == "data.progressive_start_size=16") {
      const std::string log = read_file(whole.run_dir / "train.log");
      for (const char* line : {"epoch 1: training images 16x16 (progressive resizing; full size from epoch 3)",
                               "epoch 2: training images 24x24", "epoch 3: training images 32x32"})
        EXPECT_NE(log.find(line), std::string::npos) << line << " not in\n" << log;
    }
    fs::rename(whole.run_dir, dir.path() / ("whole-done-" + std::to_string(variant.size())));
    fs::rename(split_dir, dir.path() / ("split-done-" + std::to_string(variant.size())));
  }
}

// Continuing a run from its checkpoint under another checkpoint cadence or log interval continues
// it in its own folder with no warning that the result will differ: those settings change where
// and how often a run writes, not what it computes. Another run.name is another run: it starts in
// a folder of that name from the checkpoint's state and leaves the first run's folder as it was.
// A setting that does change the result is named in a warning.
TEST(Resume, BookkeepingSettingsChangeNothingWorthAWarning) {
  TempDir dir;
  train_until_signal(resumable_run(dir.path(), "first"), 4);
  const fs::path checkpoint = dir.path() / "first" / "checkpoints" / checkpoint_file_name(4);
  ASSERT_TRUE(fs::exists(checkpoint));
  const std::string first_metrics = read_file(dir.path() / "first" / "metrics.csv");
  const TrainResult renamed = train(resumable_run(
      dir.path(), "second",
      {"checkpoint.resume=" + checkpoint.string(), "checkpoint.every_steps=5", "run.log_every_steps=3"}));
  EXPECT_EQ(renamed.run_dir, dir.path() / "second");
  EXPECT_EQ(renamed.resumed_at_step, 4);
  EXPECT_EQ(read_file(dir.path() / "first" / "metrics.csv"), first_metrics);
  EXPECT_FALSE(fs::exists(dir.path() / "first" / "checkpoints" / checkpoint_file_name(5)));
  std::string log = read_file(renamed.run_dir / "train.log");
  EXPECT_NE(log.find("run.name \"second\" is not the checkpoint's run (\"first\"): a new run in " +
                     renamed.run_dir.string() + " from its state at step 4"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("settings changed since the checkpoint"), std::string::npos) << log;

  const TrainResult same = train(resumable_run(
      dir.path(), "first", {"checkpoint.resume=" + checkpoint.string(), "checkpoint.every_steps=5", "run.log_every_steps=3"}));
  EXPECT_EQ(same.run_dir, dir.path() / "first");
  log = read_file(same.run_dir / "train.log");
  EXPECT_EQ(log.find("settings changed since the checkpoint"), std::string::npos) << log;
  EXPECT_EQ(log.find("is not the checkpoint's run"), std::string::npos) << log;

  testing::remove_tree(dir.path() / "first");
  train_until_signal(resumable_run(dir.path(), "first"), 4);
  train(resumable_run(dir.path(), "first", {"checkpoint.resume=auto", "optim.lr=0.01"}));
  log = read_file(dir.path() / "first" / "train.log");
  EXPECT_NE(log.find("settings changed since the checkpoint (the run will not repeat an uninterrupted one exactly): "
                     "optim.lr (0.05 -> 0.01)"),
            std::string::npos)
      << log;
}

TEST(Resume, InterruptedOnTheLastStepOfAnEpochThenResumed) {
  TempDir dir;
  const TrainResult whole = train(resumable_run(dir.path(), "whole"));
  // Step 16 ends epoch 2: the checkpoint is taken before that epoch's evaluation, which the
  // resumed run then does (and writes the epoch's metrics row once).
  train_until_signal(resumable_run(dir.path(), "split"), 16);
  const Checkpoint stopped = read_checkpoint(dir.path() / "split" / "checkpoints" / checkpoint_file_name(16));
  EXPECT_EQ(stopped.meta.epoch, 1);
  EXPECT_EQ(stopped.meta.epoch_steps_done, 8);
  train(resumable_run(dir.path(), "split", {"checkpoint.resume=auto"}));
  expect_same_end(whole.run_dir, dir.path() / "split", 24);
}

TEST(Resume, FromAnEpochBoundaryCheckpointByPath) {
  TempDir dir;
  const TrainResult whole = train(resumable_run(dir.path(), "whole"));
  // A copy of the finished run, continued from its checkpoint after epoch 2 (step 16): it writes
  // epoch 3 again, and must end where the original did.
  const fs::path copy = dir.path() / "copy";
  fs::copy(whole.run_dir, copy, fs::copy_options::recursive);
  const fs::path boundary = copy / "checkpoints" / checkpoint_file_name(16);
  EXPECT_EQ(read_checkpoint(boundary).meta.epoch, 2);
  EXPECT_EQ(read_checkpoint(boundary).meta.epoch_steps_done, 0);
  fs::remove(copy / "checkpoints" / checkpoint_file_name(24));
  // Under the checkpoint's own run.name it continues the folder the checkpoint lies in, not
  // run.out_dir/run.name. The weights come from the checkpoint: a model.init_from file that is
  // gone does not matter.
  const TrainResult resumed = train(resumable_run(
      dir.path() / "elsewhere", "whole",
      {"checkpoint.resume=" + boundary.string(), "model.init_from=" + (dir.path() / "gone.safetensors").string()}));
  EXPECT_EQ(resumed.run_dir, copy);
  EXPECT_FALSE(fs::exists(dir.path() / "elsewhere" / "whole"));
  expect_same_end(whole.run_dir, copy, 24);
}

/// The weights of `a` and `b` are equal bitwise.
void expect_same_weights(const fs::path& a, const fs::path& b) {
  const Checkpoint ca = read_checkpoint(a), cb = read_checkpoint(b);
  ASSERT_EQ(ca.model.size(), cb.model.size());
  for (size_t i = 0; i < ca.model.size(); ++i)
    EXPECT_TRUE(torch::equal(ca.model[i].second, cb.model[i].second)) << ca.model[i].first;
}

/// RUN_DIR/metrics.jsonl's rows as they are, "run" rows and times included.
std::vector<nlohmann::json> all_rows(const fs::path& run_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// A run that run.max_steps stopped goes on when the limit is raised or lifted, as Lightning's
// max_steps does on resume: the steps the log announces are the steps that run, to the same
// weights as a run that was never stopped. Its times go on too. Lowered below where it stands, or
// with fewer run.epochs, it stops with one line before anything is written; at its end, a resume
// trains nothing and writes nothing.
TEST(Resume, ARunStoppedByMaxStepsGoesOnToTheRaisedLimit) {
  TempDir dir;
  // A constant LR: the steps compute the same whatever run.max_steps says.
  const std::vector<std::string> constant{"schedule.name=constant"};
  const TrainResult whole = train(resumable_run(dir.path(), "whole", constant));
  ASSERT_EQ(whole.steps, 24);
  const auto run = [&](std::vector<std::string> extra) {
    extra.push_back("schedule.name=constant");
    return train(resumable_run(dir.path(), "run", extra));
  };
  // 8 steps per epoch: run.max_steps 5 ends epoch 1 after 5 of its steps, evaluated and checkpointed there.
  const TrainResult first = run({"run.max_steps=5"});
  EXPECT_EQ(first.steps, 5);
  const Checkpoint at_five = read_checkpoint(first.run_dir / "checkpoints" / checkpoint_file_name(5));
  EXPECT_EQ(at_five.meta.epoch, 0);
  EXPECT_EQ(at_five.meta.epoch_steps_done, 5);

  const TrainResult raised = run({"run.max_steps=12", "checkpoint.resume=auto"});
  EXPECT_EQ(raised.run_dir, first.run_dir);
  EXPECT_EQ(raised.resumed_at_step, 5);
  EXPECT_EQ(raised.steps, 12);
  EXPECT_EQ(raised.epochs, 2);
  std::string log = read_file(first.run_dir / "train.log");
  for (const char* line : {"8 steps per epoch of 32 images (1 x 32 accumulated), 12 steps in 2 epoch(s)\n",
                           ": step 5, epoch 1 (5 of its 8 steps done); 7 steps to go\n", "done: 2 epoch(s), 12 steps in "})
    EXPECT_NE(log.find(line), std::string::npos) << line << " not in\n" << log;
  const TrainResult lifted = run({"run.max_steps=0", "checkpoint.resume=auto"});
  EXPECT_EQ(lifted.steps, 24);
  EXPECT_EQ(lifted.epochs, 3);
  expect_same_weights(whole.run_dir / "checkpoints" / checkpoint_file_name(24),
                      first.run_dir / "checkpoints" / checkpoint_file_name(24));
  // Each evaluation's row where it came (epoch 1 at step 5 and at its end, epoch 2 at step 12 and
  // at its end), every row once; elapsed_s the whole run's, never going back at a resume.
  std::vector<std::pair<int64_t, int64_t>> epoch_rows;
  std::set<std::pair<std::string, int64_t>> seen;
  double elapsed = 0.0;
  for (const nlohmann::json& row : all_rows(first.run_dir)) {
    if (row["kind"] == "run") continue;
    EXPECT_TRUE(seen.insert({row["kind"].get<std::string>(), row["step"].get<int64_t>()}).second) << row;
    EXPECT_GE(row["elapsed_s"].get<double>(), elapsed) << row;
    elapsed = row["elapsed_s"].get<double>();
    if (row["kind"] == "epoch") epoch_rows.emplace_back(row["epoch"].get<int64_t>(), row["step"].get<int64_t>());
  }
  EXPECT_EQ(epoch_rows, (std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {1, 8}, {2, 12}, {2, 16}, {3, 24}}));
  // The run's config.json is the run's: run again, it starts a new run (checkpoint.resume none).
  EXPECT_EQ(config::load_file(first.run_dir / "config.json").config.checkpoint.resume, "none");

  // What cannot go on says why in one line, and leaves the run as it was.
  const std::vector<std::string> kept{"config.json", "metrics.jsonl", "metrics.csv", "train.log", "summary.json"};
  std::map<std::string, std::string> before;
  for (const std::string& name : kept) before[name] = read_file(first.run_dir / name);
  const std::string last = (first.run_dir / "checkpoints" / checkpoint_file_name(24)).string();
  const auto refusal = [&](const std::vector<std::string>& extra) {
    try {
      run(extra);
    } catch (const ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("(trained)");
  };
  EXPECT_EQ(refusal({"run.max_steps=20", "checkpoint.resume=auto"}),
            "--set run.max_steps=20: run.max_steps = 20: " + last + " is at step 24, past the 20 steps this config "
            "runs (run.max_steps 20); set run.max_steps above 24 (0: no limit) and run.epochs to 4 or more to train "
            "further, or start a new run (checkpoint.resume \"none\")");
  EXPECT_EQ(refusal({"run.epochs=2", "checkpoint.resume=auto"}),
            "--set run.epochs=2: run.epochs = 2: " + last + " is at step 24, past the 16 steps this config runs "
            "(run.epochs 2 of 8 steps); set run.epochs to 4 or more to train further, or start a new run "
            "(checkpoint.resume \"none\")");
  // At its end already: nothing to train, nothing written.
  EXPECT_EQ(run({"checkpoint.resume=auto"}).steps, 24);
  for (const std::string& name : kept) EXPECT_EQ(read_file(first.run_dir / name), before[name]) << name;
  // The command line: exit code 2, one line, --dry-run alike; a raise is announced with the steps to go.
  const fs::path config = write_config_file(resumable_run(dir.path(), "run", constant), dir.path() / "c.json");
  const fs::path out = dir.path() / "out";
  for (const std::string dry_run : {"", "--dry-run "}) {
    EXPECT_EQ(testing::run_ltrain("train " + dry_run + "--config " + config.string() +
                                      " checkpoint.resume=auto run.max_steps=20",
                                  out),
              2)
        << read_file(out);
    EXPECT_EQ(count_of(read_file(out), "\n"), 1u) << read_file(out);
    EXPECT_NE(read_file(out).find(" is at step 24, past the 20 steps this config runs"), std::string::npos);
  }
  EXPECT_EQ(testing::run_ltrain("train --dry-run --config " + config.string() + " checkpoint.resume=auto run.epochs=4",
                                out),
            0)
      << read_file(out);
  EXPECT_NE(read_file(out).find("32 steps in 4 epoch(s), resuming from " + last + " (step 24: 8 to go)"),
            std::string::npos)
      << read_file(out);
  for (const std::string& name : kept) EXPECT_EQ(read_file(first.run_dir / name), before[name]) << name;
  EXPECT_EQ(run({"run.epochs=4", "checkpoint.resume=auto"}).steps, 32);
}

// SIGTERM during the last evaluation, as during any other: exit code 130 with the checkpoint
// after it; the same command with checkpoint.resume=auto then trains nothing and writes the
// summary an uninterrupted run writes.
TEST(Signals, DuringTheLastEvaluationTheRunStopsWithItsCheckpointAndExitCode130) {
  TempDir dir;
  const TrainResult whole = train(resumable_run(dir.path(), "whole"));
  for (const int64_t epoch : {2, 3}) {
    const std::string name = "split-" + std::to_string(epoch);
    TrainHooks hooks;
    hooks.before_evaluation = [epoch](int64_t evaluated) {
      if (evaluated == epoch) std::raise(SIGTERM);
    };
    const fs::path checkpoint = dir.path() / name / "checkpoints" / checkpoint_file_name(8 * epoch);
    try {
      train(resumable_run(dir.path(), name), hooks);
      ADD_FAILURE() << "the run did not stop on SIGTERM during the evaluation of epoch " << epoch;
    } catch (const Interrupted& stopped) {
      EXPECT_EQ(stopped.code(), ExitCode::interrupted);
      const std::string expected =
          epoch == 3 ? "stopped by signal 15 after the last step (24) and its evaluation; checkpoint " +
                           checkpoint.string() + " written: run the same command with --set checkpoint.resume=auto "
                           "(or =" + checkpoint.string() + ") to write the run's summary"
                     : "stopped by signal 15 after step 16; checkpoint " + checkpoint.string() +
                           " written: run the same command with --set checkpoint.resume=auto (or =" +
                           checkpoint.string() + ") to continue";
      EXPECT_EQ(std::string(stopped.what()), expected);
    }
    EXPECT_EQ(read_checkpoint(checkpoint).meta.epoch, epoch);
    EXPECT_FALSE(fs::exists(dir.path() / name / "summary.json"));
    const TrainResult resumed = train(resumable_run(dir.path(), name, {"checkpoint.resume=auto"}));
    EXPECT_EQ(resumed.steps, 24);
    expect_same_end(whole.run_dir, dir.path() / name, 24);
  }
  EXPECT_NE(read_file(dir.path() / "split-3" / "train.log")
                .find(" is at step 24, the end of this run (run.epochs 3 of 8 steps), after its last evaluation: "
                      "nothing left to train; writing the run's summary\n"),
            std::string::npos)
      << read_file(dir.path() / "split-3" / "train.log");
}

TEST(Resume, AutoSkipsDamagedCheckpointsAndRefusesAnotherModel) {
  TempDir dir;
  train_until_signal(resumable_run(dir.path(), "run"), 13);
  const fs::path checkpoints = dir.path() / "run" / "checkpoints";
  // The newest (13) loses its tail, the one before (12) gets a flipped bit: auto goes back to 9.
  const fs::path newest = checkpoints / checkpoint_file_name(13), second = checkpoints / checkpoint_file_name(12);
  fs::resize_file(newest, fs::file_size(newest) / 2);
  {
    std::fstream file(second, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(fs::file_size(second) / 2));
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(static_cast<std::streamoff>(fs::file_size(second) / 2));
    byte = static_cast<char>(byte ^ 0x10);
    file.write(&byte, 1);
  }
  const auto found = newest_valid_checkpoint(checkpoints);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->file, checkpoints / checkpoint_file_name(9));

  // Another width: refused before anything is written, naming the setting.
  try {
    train(resumable_run(dir.path(), "run", {"checkpoint.resume=auto", "model.width=16"}));
    FAIL() << "a checkpoint of another model was resumed";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("model.width = 8 but this config says 16"), std::string::npos)
        << error.what();
  }
  // A file that is not there: one line naming the key and what to use, exit code 2, nothing created.
  testing::write_file(dir.path() / "c.json", R"({"run": {"device": "cpu", "out_dir": ")" +
                                                 (dir.path() / "elsewhere").string() + R"("}})");
  EXPECT_EQ(testing::run_ltrain("train --config " + (dir.path() / "c.json").string() +
                                    " --set checkpoint.resume=" + (dir.path() / "none.ltc").string(),
                                dir.path() / "log"),
            2);
  EXPECT_NE(read_file(dir.path() / "log").find("checkpoint.resume = \"" + (dir.path() / "none.ltc").string() +
                                               "\": no such checkpoint file; use \"auto\", \"none\" or the path of a "
                                               ".ltc file"),
            std::string::npos)
      << read_file(dir.path() / "log");
  EXPECT_FALSE(fs::exists(dir.path() / "elsewhere"));
  // A damaged file named directly is an error, not a fallback.
  EXPECT_THROW(train(resumable_run(dir.path(), "run", {"checkpoint.resume=" + second.string()})), DataError);

  const TrainResult resumed = train(resumable_run(dir.path(), "run", {"checkpoint.resume=auto"}));
  EXPECT_EQ(resumed.steps, 24);
  EXPECT_NE(read_file(resumed.run_dir / "train.log").find("step-00000009.ltc"), std::string::npos);
}

TEST(Resume, AutoSkipsACheckpointWhoseHeaderOrGeneratorStateLtrainDidNotWrite) {
  TempDir dir;
  train_until_signal(resumable_run(dir.path(), "run"), 6);
  const fs::path checkpoints = dir.path() / "run" / "checkpoints";
  const fs::path newest = checkpoints / checkpoint_file_name(6);
  const io::TensorArchive original = io::read_archive(newest);
  // Each rewritten with a valid checksum: only what the header holds tells it from ltrain's own.
  const std::vector<std::pair<std::string, std::function<void(io::TensorArchive&)>>> crafted{
      {"\"epoch\" is no count", [](io::TensorArchive& a) { a.info["epoch"] = "one"; }},
      {"\"step\" is no count", [](io::TensorArchive& a) { a.info["step"] = -6; }},
      {"config section \"model\" is no object", [](io::TensorArchive& a) { a.info["config"]["model"] = "resnet18"; }},
      {"\"config\" is no object", [](io::TensorArchive& a) { a.info["config"] = nlohmann::json::array(); }},
      {"\"progress\" is no object", [](io::TensorArchive& a) { a.info["progress"] = 3; }},
      {"progress.best_epoch is no plain value", [](io::TensorArchive& a) { a.info["progress"]["best_epoch"] = {1}; }},
  };
  for (const auto& [why, craft] : crafted) {
    io::TensorArchive archive = original;
    craft(archive);
    io::write_archive(newest, archive);
    try {
      read_checkpoint(newest);
      ADD_FAILURE() << why << ": read";
    } catch (const DataError& error) {
      EXPECT_EQ(std::string(error.what()),
                newest.string() + ": checkpoint header is malformed (" + why + "); use an earlier checkpoint");
    }
    const auto found = newest_valid_checkpoint(checkpoints);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->file, checkpoints / checkpoint_file_name(3)) << why;
  }
  // A generator state of another form is refused before LibTorch sees it.
  io::TensorArchive archive = original;
  for (auto& [name, tensor] : archive.tensors)
    if (name == "rng/cpu") tensor = tensor.to(torch::kFloat32);
  io::write_archive(newest, archive);
  try {
    train(resumable_run(dir.path(), "run", {"checkpoint.resume=" + newest.string()}));
    FAIL() << "resumed from a float32 generator state";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find(newest.string() + ": its cpu random generator state is malformed"),
              std::string::npos)
        << error.what();
  }
  // A progress value of the wrong type ends the resume with a line naming the file.
  archive = original;
  archive.info["progress"]["has_best_metric"] = 2;
  io::write_archive(newest, archive);
  try {
    train(resumable_run(dir.path(), "run", {"checkpoint.resume=" + newest.string()}));
    FAIL() << "resumed from a progress of the wrong type";
  } catch (const DataError& error) {
    EXPECT_EQ(std::string(error.what()),
              newest.string() + ": its training progress holds a value of the wrong type; use an earlier checkpoint");
  }
}

TEST(Resume, KeepLastAndBestCheckpoint) {
  TempDir dir;
  const TrainResult result = train(resumable_run(
      dir.path(), "run",
      {"run.epochs=4", "checkpoint.every_steps=0", "checkpoint.keep_last=2", "checkpoint.best_metric=test_loss"}));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(result.run_dir / "checkpoints"))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"best.ltc", checkpoint_file_name(24), checkpoint_file_name(32)}));
  // best.ltc is the state after the epoch with the lowest test loss.
  int64_t best_epoch = 0;
  double best_loss = 1e300;
  for (const auto& row : metrics_rows(result.run_dir))
    if (row["kind"] == "epoch" && row["test_loss"].get<double>() < best_loss) {
      best_loss = row["test_loss"].get<double>();
      best_epoch = row["epoch"].get<int64_t>();
    }
  const Checkpoint best = read_checkpoint(result.run_dir / "checkpoints" / kBestCheckpointName);
  EXPECT_EQ(best.meta.epoch, best_epoch);
  EXPECT_DOUBLE_EQ(best.meta.metrics["test_loss"].get<double>(), best_loss);
}

TEST(Resume, FailedCheckpointWriteKeepsThePreviousFile) {
  TempDir dir;
  const auto loaded = resumable_run(dir.path(), "run");
  models::ResNet model = build_model(loaded, torch::kCPU);
  const fs::path file = dir.path() / "step.ltc";
  CheckpointMeta meta;
  meta.step = 1;
  save_checkpoint(file, *model, nullptr, nullptr, meta);
  // The temporary file's name taken by a folder: the write fails as on a full or read-only disk.
  fs::create_directory(file.string() + ".tmp-" + std::to_string(::getpid()));
  meta.step = 2;
  EXPECT_THROW(save_checkpoint(file, *model, nullptr, nullptr, meta), RunError);
  EXPECT_EQ(read_checkpoint(file).meta.step, 1);
}

TEST(Resume, SigtermToATrainingProcessLeavesAResumableCheckpoint) {
  TempDir dir;
  const fs::path config = dir.path() / "c.json";
  // Big enough to still be training when the signal comes (tens of seconds on two cores).
  testing::write_file(config, R"({"run": {"out_dir": ")" + dir.path().string() +
                                  R"(", "name": "run", "epochs": 2, "log_every_steps": 1, "device": "cpu"},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 16},
    "data": {"source": "synthetic", "synthetic_train_size": 1024, "synthetic_test_size": 64, "batch_size": 32}})");
  const fs::path log = dir.path() / "log";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execl(LTRAIN_EXECUTABLE, "ltrain", "train", "--config", config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait for the second logged step, then ask it to stop.
  const fs::path metrics = dir.path() / "run" / "metrics.csv";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  auto logged_steps = [&] {
    std::ifstream in(metrics);
    int64_t lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    return lines - 1;
  };
  while (logged_steps() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(logged_steps(), 2) << read_file(log);
  ::kill(child, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130) << read_file(log);
  EXPECT_NE(read_file(log).find("checkpoint.resume=auto"), std::string::npos) << read_file(log);
  const auto found = newest_valid_checkpoint(dir.path() / "run" / "checkpoints");
  ASSERT_TRUE(found.has_value());
  EXPECT_LT(found->checkpoint.meta.step, 2 * 32);

  EXPECT_EQ(testing::run_ltrain("train --config " + config.string() + " --set checkpoint.resume=auto", log), 0)
      << read_file(log);
  const nlohmann::json summary = nlohmann::json::parse(read_file(dir.path() / "run" / "summary.json"));
  EXPECT_EQ(summary["steps"], 2 * 32);
  // The times are the whole run's, the first process's up to its checkpoint included; this
  // process's share is apart, and each is at most its whole.
  const nlohmann::json& here = summary["this_process"];
  EXPECT_EQ(here["resumed_at_step"], found->checkpoint.meta.step);
  EXPECT_EQ(here["steps"], 2 * 32 - found->checkpoint.meta.step);
  EXPECT_GT(here["train_seconds"].get<double>(), 0.0);
  EXPECT_LT(here["train_seconds"].get<double>(), summary["train_seconds"].get<double>());
  EXPECT_LT(here["wall_seconds"].get<double>(), summary["wall_seconds"].get<double>());
  EXPECT_LE(summary["train_seconds"].get<double>(), summary["wall_seconds"].get<double>());
  EXPECT_NE(read_file(log).find("; this process from step " + std::to_string(found->checkpoint.meta.step) + ": "),
            std::string::npos)
      << read_file(log);
}

TEST(Signals, DuringSetUpTheRunStopsBeforeAnythingIsWritten) {
  TempDir dir;
  TrainHooks hooks;
  hooks.after_setup = [] { std::raise(SIGTERM); };
  try {
    train(resumable_run(dir.path(), "run"), hooks);
    FAIL() << "the run did not stop on SIGTERM during set-up";
  } catch (const Interrupted& stopped) {
    EXPECT_EQ(std::string(stopped.what()),
              "stopped by signal 15 during set-up, before step 1; nothing was written: run the same command again");
  }
  EXPECT_FALSE(fs::exists(dir.path() / "run"));
  // A resumed run: its checkpoint and metrics stay as they were.
  train_until_signal(resumable_run(dir.path(), "run"), 10);
  const std::string metrics = read_file(dir.path() / "run" / "metrics.jsonl");
  hooks.after_setup = [] { std::raise(SIGINT); };
  EXPECT_THROW(train(resumable_run(dir.path(), "run", {"checkpoint.resume=auto"}), hooks), Interrupted);
  EXPECT_EQ(read_file(dir.path() / "run" / "metrics.jsonl"), metrics);
  EXPECT_EQ(newest_valid_checkpoint(dir.path() / "run" / "checkpoints")->checkpoint.meta.step, 10);
}

TEST(Signals, ASecondSignalWithinTheGracePeriodIsTheSameRequest) {
  TempDir dir;
  const TrainResult whole = train(resumable_run(dir.path(), "whole"));
  // SIGTERM, then SIGINT and SIGTERM again at once (a terminal's Ctrl-C and a launcher's copy,
  // torchrun's SIGINT then SIGTERM): still one stop after step 10, with its checkpoint.
  TrainHooks hooks;
  hooks.after_step = [](int64_t step) {
    if (step != 10) return;
    std::raise(SIGTERM);
    std::raise(SIGINT);
    std::raise(SIGTERM);
  };
  EXPECT_THROW(train(resumable_run(dir.path(), "split"), hooks), Interrupted);
  EXPECT_EQ(newest_valid_checkpoint(dir.path() / "split" / "checkpoints")->checkpoint.meta.step, 10);
  train(resumable_run(dir.path(), "split", {"checkpoint.resume=auto"}));
  expect_same_end(whole.run_dir, dir.path() / "split", 24);
}

TEST(Signals, SigtermAtAnyMomentEndsWithOneLineAndExitCode130) {
  TempDir dir;
  const fs::path config = write_config_file(resumable_run(dir.path(), "run", {"run.epochs=100"}), dir.path() / "c.json");
  // From main's first line on (its handler is installed): while the config loads, during set-up,
  // and in training. Never the default action's silent 143.
  for (const double delay : {0.0, 0.05, 0.3, 1.0, 2.5}) {
    LtrainProcess run({"train", "--config", config.string()});
    ASSERT_TRUE(wait_until([&] { return run.catches_sigterm(); }, 60)) << run.output();
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
    EXPECT_EQ(run.wait(120), 130) << "delay " << delay << " s:\n" << run.output();
    EXPECT_EQ(count_of(run.output(), "stopped by signal 15"), 1u) << "delay " << delay << " s:\n" << run.output();
  }
}

// A signal while the shared libraries' initializers run (LibTorch's take a few hundred
// milliseconds before main) still gets the stop line and exit code 130: a preloaded library sends
// SIGTERM from its initializer.
TEST(Signals, SigtermBeforeMainEndsWithOneLineAndExitCode130) {
  TempDir dir;
  const fs::path preload = fs::path(LTRAIN_EXECUTABLE).parent_path() / "tests" / "libltrain_raise_sigterm_early.so";
  ASSERT_TRUE(fs::exists(preload)) << preload;
  const std::string command = "LD_PRELOAD=" + preload.string() + " " LTRAIN_EXECUTABLE " --version > " +
                              (dir.path() / "out").string() + " 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_EQ(read_file(dir.path() / "out"), "\nltrain: stopped by signal 15\n");
}

// From ltrain's first instruction on: while the loader maps LibTorch's libraries into ltrain-core,
// during their initializers, while the config loads. The launcher blocks SIGTERM before anything
// else and ltrain-core unblocks it once its handler is installed; ltrain-core started alone would
// end silently with 143 while it loads. (Before the first instruction, while the kernel still
// executes the launcher, a signal meets the default action whatever the program.)
TEST(Signals, SigtermInTheFirst300MillisecondsEndsWithOneLineAndExitCode130) {
  TempDir dir;
  const fs::path config = write_config_file(resumable_run(dir.path(), "run", {"run.epochs=100"}), dir.path() / "c.json");
  std::vector<double> delays_ms{0, 0.2, 1, 2, 5, 10, 20, 40, 70, 100, 150, 200, 300};
  const unsigned seed = std::random_device{}();
  std::mt19937 random(seed);
  std::uniform_real_distribution<double> uniform_ms(0.0, 300.0);
  for (int extra = 0; extra < 8; ++extra) delays_ms.push_back(uniform_ms(random));
  for (const double delay_ms : delays_ms) {
    const std::string context = "delay " + std::to_string(delay_ms) + " ms (seed " + std::to_string(seed) + "):\n";
    LtrainProcess run({"train", "--config", config.string()});
    // Its first state with SIGTERM taken care of: blocked (by the launcher), not yet caught.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool blocked = false, caught = false;
    while (!blocked && !caught && std::chrono::steady_clock::now() < deadline) {
      blocked = run.blocks_sigterm();
      caught = run.catches_sigterm();
      if (!blocked && !caught) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_TRUE(blocked) << context << (caught ? "SIGTERM was caught before it was ever seen blocked" : "timed out")
                         << "\n" << run.output();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
    ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
    EXPECT_EQ(run.wait(120), 130) << context << run.output();
    EXPECT_EQ(count_of(run.output(), "stopped by signal 15"), 1u) << context << run.output();
  }
}

TEST(Signals, TwoSigtermsMillisecondsApartStillCheckpoint) {
  TempDir dir;
  const fs::path config = write_config_file(resumable_run(dir.path(), "run", {"run.epochs=100"}), dir.path() / "c.json");
  for (const int gap_ms : {5, 20, 50}) {
    const std::string name = "gap-" + std::to_string(gap_ms);
    LtrainProcess run({"train", "--config", config.string(), "--set", "run.name=" + name});
    ASSERT_TRUE(wait_until([&] { return last_logged_step(dir.path() / name) >= 2; }, 120)) << run.output();
    ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
    EXPECT_EQ(run.wait(120), 130) << run.output();
    EXPECT_NE(run.output().find("written: run the same command with --set checkpoint.resume=auto"), std::string::npos)
        << run.output();
    EXPECT_EQ(run.output().find("second signal"), std::string::npos) << run.output();
    const auto found = newest_valid_checkpoint(dir.path() / name / "checkpoints");
    ASSERT_TRUE(found.has_value());
    EXPECT_GE(found->checkpoint.meta.step, last_logged_step(dir.path() / name));
  }
}

TEST(Resume, KilledAgainAndAgainItLosesNoStepAndLeavesNoTemporaryFile) {
  TempDir dir;
  // A checkpoint after every step; the same config uninterrupted is the reference.
  const auto loaded = resumable_run(dir.path(), "killed", {"run.epochs=6", "run.log_every_steps=1", "checkpoint.every_steps=1"});
  const fs::path config = write_config_file(loaded, dir.path() / "c.json");
  ASSERT_EQ(testing::run_ltrain("train --config " + config.string() + " --set run.name=whole", dir.path() / "whole.log"), 0)
      << read_file(dir.path() / "whole.log");
  const fs::path run_dir = dir.path() / "killed";
  const std::vector<std::string> resume{"train", "--config", config.string(), "--set", "checkpoint.resume=auto"};
  for (int kill = 0; kill < 5; ++kill) {
    LtrainProcess run(resume);
    const int64_t target = 4 + 8 * kill;  // 48 steps in all
    ASSERT_TRUE(wait_until([&] { return last_logged_step(run_dir) >= target; }, 120)) << run.output();
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * kill));  // land elsewhere in a step each time
    ASSERT_EQ(::kill(run.pid(), SIGKILL), 0);
    ASSERT_EQ(run.wait(60), 128 + SIGKILL) << run.output();
    // At most the step in progress is lost: a step's row is written just before its checkpoint.
    const auto found = newest_valid_checkpoint(run_dir / "checkpoints");
    ASSERT_TRUE(found.has_value());
    EXPECT_GE(found->checkpoint.meta.step, last_logged_step(run_dir) - 1) << "kill " << kill;
  }
  // Two more temporaries: a process that is gone left one, this test process (alive) the other.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const fs::path stale = run_dir / "checkpoints" / (checkpoint_file_name(99) + ".tmp-" + std::to_string(gone));
  const fs::path living = run_dir / "checkpoints" / (checkpoint_file_name(98) + ".tmp-" + std::to_string(::getpid()));
  testing::write_file(stale, "x");
  testing::write_file(living, "x");

  LtrainProcess last(resume);
  ASSERT_EQ(last.wait(300), 0) << last.output();
  EXPECT_EQ(temporary_files(run_dir), std::vector<fs::path>{living});
  fs::remove(living);
  // Every step's row once, and the weights, optimizer state and summary of the uninterrupted run.
  expect_same_end(dir.path() / "whole", run_dir, 48);
}

/// In the child before exec: a write past RLIMIT_FSIZE fails (EFBIG) instead of killing it.
void ignore_file_size_signal() { ::signal(SIGXFSZ, SIG_IGN); }

TEST(Resume, AFileThatCannotBeWrittenStopsTheRunAtOnceAndKeepsItsCheckpoints) {
  TempDir dir;
  const fs::path config = write_config_file(
      resumable_run(dir.path(), "run", {"run.epochs=100", "run.log_every_steps=1", "checkpoint.every_steps=1"}),
      dir.path() / "c.json");
  const fs::path run_dir = dir.path() / "run";
  // Output through a pipe: the limit applies to every file the process writes.
  LtrainProcess run({"train", "--config", config.string()}, LtrainProcess::Output::pipe, ignore_file_size_signal);
  ASSERT_TRUE(wait_until([&] { return fs::exists(run_dir / "checkpoints" / checkpoint_file_name(3)); }, 120))
      << run.output();
  // From now on every file stops growing at 1 byte, as a full disk would: the next write fails,
  // whichever it is (a metrics row, a log line, a checkpoint).
  rlimit limit{};
  ASSERT_EQ(::prlimit(run.pid(), RLIMIT_FSIZE, nullptr, &limit), 0);
  limit.rlim_cur = 1;
  ASSERT_EQ(::prlimit(run.pid(), RLIMIT_FSIZE, &limit, nullptr), 0);
  EXPECT_EQ(run.wait(120), 4) << run.output();
  const std::string output = run.output();
  std::smatch failure;
  ASSERT_TRUE(std::regex_search(output, failure,
                                std::regex("error (\\S+): cannot write \\(File too large\\): raise the file-size limit "
                                           "\\(ulimit -f\\) or write elsewhere; the checkpoints already in (\\S+) are "
                                           "intact: once it is fixed, the same command with --set "
                                           "checkpoint.resume=auto continues the run\\n")))
      << output;
  EXPECT_EQ(failure[1].str().rfind(run_dir.string() + "/", 0), 0u) << "not a file of the run: " << failure[1];
  EXPECT_EQ(failure[2].str(), (run_dir / "checkpoints").string());
  // Every checkpoint written reads and verifies; the run stopped long before its end.
  int64_t last_step = 0;
  for (const fs::path& file : testing::files_below(run_dir / "checkpoints", ".ltc"))
    last_step = std::max(last_step, read_checkpoint(file).meta.step);
  EXPECT_GE(last_step, 3);
  EXPECT_LT(last_step, 100);
  EXPECT_TRUE(temporary_files(run_dir).empty());
  // Fixed, the same command continues.
  EXPECT_EQ(testing::run_ltrain("train --config " + config.string() + " --set checkpoint.resume=auto --set "
                                "run.max_steps=" + std::to_string(last_step + 2),
                                dir.path() / "resume.log"),
            0)
      << read_file(dir.path() / "resume.log");
}

TEST(InitFrom, StartsFromSafetensorsAndNamesWhatDoesNotFit) {
  TempDir dir;
  const auto loaded = resumable_run(dir.path(), "run");
  models::ResNet source = build_model(resumable_run(dir.path(), "run", {"run.seed=7"}), torch::kCPU);
  const fs::path weights = dir.path() / "w.safetensors";
  io::write_safetensors(weights, state_dict(*source));

  models::ResNet started = build_model(resumable_run(dir.path(), "run", {"model.init_from=" + weights.string()}),
                                       torch::kCPU);
  const NamedTensors a = state_dict(*source), b = state_dict(*started);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;

  EXPECT_THROW(build_model(resumable_run(dir.path(), "run", {"model.init_from=" + (dir.path() / "no").string()}),
                           torch::kCPU),
               ConfigError);
  // A system file that passes for a regular file and cannot be read: said so, as a config error.
  try {
    build_model(resumable_run(dir.path(), "run", {"model.init_from=/proc/self/mem"}), torch::kCPU);
    FAIL() << "/proc/self/mem was taken for weights";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              "--set model.init_from=/proc/self/mem: model.init_from = \"/proc/self/mem\": cannot be read (Input/output "
              "error): not a file with contents of its own (expected a .safetensors file of the model's weights)");
  }
  try {
    build_model(resumable_run(dir.path(), "run", {"model.init_from=" + weights.string(), "model.num_classes=5"}),
                torch::kCPU);
    FAIL() << "weights for 10 classes went into a 5-class model";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("\"fc.weight\" has shape [10, 64]"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace ltrain::engine
