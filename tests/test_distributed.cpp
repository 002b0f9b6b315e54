// Data-parallel training on the CPU with Gloo: the gradient reducer in one process, and real
// multi-process runs through `ltrain launch` and through torchrun's variables set by hand: the
// same weights as one process with the same global batch, exact resume, a killed rank, configs
// that differ between ranks, bad launcher input, torchrun's agent store, two nodes on one
// machine. The launcher's checks of its options, its exit-code rule and torchrun's variables in
// one process.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fstream>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <regex>
#include <thread>

#include <sstream>

#include "ltrain/core/errors.h"
#include "ltrain/dist/grad_reducer.h"
#include "ltrain/dist/group.h"
#include "ltrain/dist/launch.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/module_options.h"
#include "support.h"

namespace ltrain::dist {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_ltrain;
using testing::TempDir;
using testing::write_file;

/// A tiny CPU run: ResNet-18 of width 4, 64 synthetic training images (4 global batches of 16),
/// 30 test images, SyncBatchNorm so that 2 x 8 images normalize like 1 x 16.
fs::path write_config(const TempDir& dir) {
  write_file(dir.path() / "run.json", R"({"run": {"device": "cpu", "epochs": 1, "log_every_steps": 1, "threads": 1,
      "out_dir": ")" + (dir.path() / "runs").string() + R"("},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4},
    "data": {"source": "synthetic", "synthetic_train_size": 64, "synthetic_test_size": 30, "batch_size": 8},
    "optim": {"name": "sgd", "lr": 0.02, "momentum": 0.9},
    "schedule": {"name": "constant"},
    "precision": {"deterministic": true},
    "distributed": {"sync_batch_norm": true, "timeout_s": 20}})");
  return dir.path() / "run.json";
}

engine::Checkpoint last_checkpoint(const fs::path& run_dir) {
  const auto files = testing::files_below(run_dir / "checkpoints", ".ltc");
  EXPECT_FALSE(files.empty()) << run_dir;
  return engine::read_checkpoint(files.back());
}

/// Largest |a - b| over every tensor of two checkpoints' models, relative to the largest |b|.
double model_difference(const engine::Checkpoint& a, const engine::Checkpoint& b) {
  double worst = 0.0;
  EXPECT_EQ(a.model.size(), b.model.size());
  for (size_t i = 0; i < std::min(a.model.size(), b.model.size()); ++i) {
    EXPECT_EQ(a.model[i].first, b.model[i].first);
    const torch::Tensor x = a.model[i].second.to(torch::kFloat64), y = b.model[i].second.to(torch::kFloat64);
    const double scale = 1.0 + y.abs().max().item<double>();
    worst = std::max(worst, (x - y).abs().max().item<double>() / scale);
  }
  return worst;
}

nlohmann::json summary(const fs::path& run_dir) { return nlohmann::json::parse(read_file(run_dir / "summary.json")); }

/// Starts `ltrain ARGS_r` for each rank r with torchrun's variables (backgrounded, so that a test
/// can kill one); returns at once. Rank r's output goes to DIR/rank-r.log, its exit code to
/// DIR/rank-r.code, its pid to DIR/rank-r.pid. `variables`: more of them ("NAME=value ...").
void start_ranks(const fs::path& dir, const std::vector<std::string>& args, int64_t port = free_port(),
                 const std::string& variables = "") {
  std::string script;
  for (size_t rank = 0; rank < args.size(); ++rank) {
    const std::string stem = (dir / ("rank-" + std::to_string(rank))).string();
    script += "(sh -c 'echo $$ > \"" + stem + ".pid\"; exec env RANK=" + std::to_string(rank) +
              " LOCAL_RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(args.size()) +
              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + variables + " " +
              LTRAIN_EXECUTABLE + " " + args[rank] + " > \"" + stem + ".log\" 2>&1'; echo $? > '" + stem +
              ".code') &\n";
  }
  ASSERT_EQ(std::system(("(" + script + "wait) > /dev/null 2>&1 &").c_str()), 0);
}

/// Runs `ltrain ARGS` in the folder `cwd` (relative paths in a config are relative to it); its exit code.
int run_ltrain_in(const fs::path& cwd, const std::string& args, const fs::path& log) {
  fs::create_directories(cwd);
  const int status = std::system(("cd '" + cwd.string() + "' && " + LTRAIN_EXECUTABLE + " " + args + " > '" +
                                  log.string() + "' 2>&1")
                                     .c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The pid of the child of `parent` that runs global rank `rank` (from /proc), or -1.
pid_t child_with_rank(pid_t parent, int64_t rank) {
  const std::string wanted = "RANK=" + std::to_string(rank);
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t after_name = text.rfind(')');
    if (after_name == std::string::npos) continue;
    std::istringstream fields(text.substr(after_name + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream environ_file(entry.path() / "environ");
    for (std::string variable; std::getline(environ_file, variable, '\0');)
      if (variable == wanted) return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

/// The lines of `text` that contain `part`.
std::vector<std::string> lines_with(const std::string& text, const std::string& part) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(part) != std::string::npos) lines.push_back(line);
  return lines;
}

/// Waits up to `seconds` for `file` to exist and be non-empty.
bool wait_for_file(const fs::path& file, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fs::exists(file) && fs::file_size(file) > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

/// Kills what is left of the ranks start_ranks began (a failed test must not leave them training).
struct RankReaper {
  fs::path dir;
  size_t ranks;
  ~RankReaper() {
    for (size_t rank = 0; rank < ranks; ++rank) {
      const fs::path pid = dir / ("rank-" + std::to_string(rank) + ".pid");
      if (!fs::exists(pid)) continue;
      std::string number = read_file(pid);
      number.erase(number.find_last_not_of(" \n") + 1);
      const int status = std::system(("kill -9 " + number + " 2>/dev/null").c_str());
      (void)status;  // gone already: nothing to do
    }
  }
};

int exit_code(const fs::path& dir, int rank, double seconds) {
  const fs::path file = dir / ("rank-" + std::to_string(rank) + ".code");
  if (!wait_for_file(file, seconds)) return -1;
  return std::stoi(read_file(file));
}

/// These tests run Gloo processes on the CPU.
#define SKIP_WITHOUT_GLOO() \
  if (!LTRAIN_WITH_GLOO) GTEST_SKIP() << "built without gloo's headers (libgloo-dev)"

TEST(GradientReducer, AveragesTheLastMicroBatchPlusTheAccumulatedGradients) {
  SKIP_WITHOUT_GLOO();
  // One Gloo process: the mean over ranks is the local gradient, which shows the bucket logic.
  Environment environment;
  environment.master_port = free_port();
  GroupOptions options = engine::group_options(config::DistributedSection{});
  options.timeout_s = 20;
  Group group(environment, options, torch::Device(torch::kCPU));

  // Three parameters; the second computes through a bf16 low-precision copy as under autocast; the
  // third is channels_last and stays unused in the backward pass. Tiny buckets: one per parameter.
  torch::Tensor a = torch::randn({3}).requires_grad_(true);
  torch::Tensor b = torch::randn({2, 2}).requires_grad_(true);
  torch::Tensor b_copy = b.detach().to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor c = torch::randn({2, 3, 2, 2}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
  GradientReducer reducer(group, {{a, a}, {b, b_copy}, {c, c}}, /*bucket_mb=*/1e-6);
  EXPECT_EQ(reducer.bucket_count(), 3u);

  // The copy's gradient goes into b's float32 gradient after each backward, as collect_gradients does.
  auto micro_batch = [&](double weight) {
    torch::Tensor loss = (a * weight).square().sum() + (b_copy.to(torch::kFloat32) * weight).sum();
    loss.backward();
    const torch::Tensor copy_grad = b_copy.grad().to(torch::kFloat32);
    if (b.grad().defined()) {
      b.mutable_grad().add_(copy_grad);
    } else {
      b.mutable_grad() = copy_grad.clone();
    }
    b_copy.mutable_grad() = torch::Tensor();
  };
  micro_batch(1.0);  // not armed: nothing is sent
  reducer.arm(/*accumulated=*/true);
  micro_batch(3.0);
  reducer.finish();
  const torch::Tensor expected_a = 2 * a.detach() * 1.0 + 2 * a.detach() * 9.0;
  EXPECT_TRUE(torch::allclose(a.grad(), expected_a)) << a.grad() << expected_a;
  EXPECT_TRUE(torch::allclose(b.grad(), torch::full({2, 2}, 4.0))) << b.grad();
  ASSERT_TRUE(c.grad().defined());  // unused: it still takes part, as zeros
  EXPECT_EQ(c.grad().abs().sum().item<double>(), 0.0);

  // The gradients are views of the buckets now, in the parameters' layouts.
  EXPECT_EQ(c.grad().strides(), c.strides());
  // The next step starts from zero_grad (set to none), as the training step does.
  for (torch::Tensor* param : {&a, &b, &c}) param->mutable_grad() = torch::Tensor();
  reducer.arm(/*accumulated=*/false);
  torch::Tensor loss = a.sum();
  loss.backward();
  reducer.finish();
  EXPECT_TRUE(torch::allclose(a.grad(), torch::ones({3}))) << a.grad();
  EXPECT_EQ(b.grad().abs().sum().item<double>(), 0.0);  // unused this time: zeros, not last step's
}

TEST(GradientReducer, HalfPrecisionOnTheWireGivesFloat32GradientsRoundedOnce) {
  SKIP_WITHOUT_GLOO();
  Environment environment;
  environment.master_port = free_port();
  Group group(environment, engine::group_options(config::DistributedSection{}), torch::Device(torch::kCPU));
  torch::Tensor w = torch::zeros({4}).requires_grad_(true);
  GradientReducer reducer(group, {{w, w}}, /*bucket_mb=*/25, torch::kHalf);
  const torch::Tensor target = torch::tensor({1.0f, 1e-4f, 3.14159f, -65504.0f});
  reducer.arm(false);
  (w * target).sum().backward();
  reducer.finish();
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
  // Each gradient went through fp16 once: 1 and -65504 exactly, the others to fp16's 11 bits.
  EXPECT_TRUE(torch::equal(w.grad(), target.to(torch::kHalf).to(torch::kFloat32))) << w.grad();
  EXPECT_FALSE(torch::equal(w.grad(), target));
}

TEST(Distributed, TwoProcessesMatchOneWithTheSameGlobalBatch) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const fs::path config = write_config(dir);
  const std::string train = "train --config " + config.string();
  ASSERT_EQ(run_ltrain("launch -n 2 -- " + train + " --set run.name=two", dir.path() / "two.log"), 0)
      << read_file(dir.path() / "two.log");
  ASSERT_EQ(run_ltrain(train + " --set run.name=one --set data.batch_size=16", dir.path() / "one.log"), 0)
      << read_file(dir.path() / "one.log");
  const fs::path two = dir.path() / "runs" / "two", one = dir.path() / "runs" / "one";
  // Only rank 0 writes: one run directory, one log.
  EXPECT_FALSE(fs::exists(dir.path() / "runs" / "two-1"));
  EXPECT_NE(read_file(two / "train.log").find("data-parallel: 2 processes (gloo), 8 images per process per step"),
            std::string::npos);
  EXPECT_EQ(summary(two)["steps"], 4);

  // 4 steps of 2 x 8 images with averaged gradients and synchronized BatchNorm are 4 steps of 16.
  EXPECT_LT(model_difference(last_checkpoint(two), last_checkpoint(one)), 1e-4);
  EXPECT_NEAR(summary(two)["final_test_loss"].get<double>(), summary(one)["final_test_loss"].get<double>(), 1e-3);

  // Evaluation is sharded (15 + 15 test images) and its counts summed: the same figures as one
  // process evaluating rank 0's checkpoint.
  const auto checkpoints = testing::files_below(two / "checkpoints", ".ltc");
  ASSERT_EQ(run_ltrain("eval --checkpoint " + checkpoints.back().string() + " --json", dir.path() / "eval.log"), 0);
  const std::string eval = read_file(dir.path() / "eval.log");  // log lines, then the result's one JSON line
  const nlohmann::json evaluated = nlohmann::json::parse(eval.substr(eval.rfind("\n{") + 1));
  EXPECT_EQ(evaluated["accuracy"].get<double>(), summary(two)["final_test_accuracy"].get<double>());
  EXPECT_NEAR(evaluated["loss"].get<double>(), summary(two)["final_test_loss"].get<double>(), 1e-5);

  // Gradients sent as fp16: the same run up to fp16's rounding of each gradient.
  ASSERT_EQ(run_ltrain("launch -n 2 -- " + train + " --set run.name=two-fp16 --set distributed.gradient_dtype=fp16",
                       dir.path() / "two-fp16.log"),
            0)
      << read_file(dir.path() / "two-fp16.log");
  const double fp16_difference = model_difference(last_checkpoint(dir.path() / "runs" / "two-fp16"), last_checkpoint(one));
  EXPECT_GT(fp16_difference, 0.0);
  EXPECT_LT(fp16_difference, 1e-2);
}

TEST(Distributed, FourAndEightProcessesMatchOneWithTheSameGlobalBatch) {
  SKIP_WITHOUT_GLOO();
  // The code paths of 4 and 8 ranks (without a machine of that many GPUs): 4 x 4 and 8 x 2
  // images per step against 1 x 16, SyncBatchNorm over all of them.
  TempDir dir;
  const std::string train = "train --config " + write_config(dir).string();
  ASSERT_EQ(run_ltrain(train + " --set run.name=one --set data.batch_size=16", dir.path() / "one.log"), 0);
  const engine::Checkpoint one = last_checkpoint(dir.path() / "runs" / "one");
  for (int processes : {4, 8}) {
    const std::string name = "ranks-" + std::to_string(processes);
    ASSERT_EQ(run_ltrain("launch -n " + std::to_string(processes) + " -- " + train + " --set run.name=" + name +
                             " --set data.batch_size=" + std::to_string(16 / processes),
                         dir.path() / (name + ".log")),
              0)
        << read_file(dir.path() / (name + ".log"));
    EXPECT_LT(model_difference(last_checkpoint(dir.path() / "runs" / name), one), 1e-4) << processes;
    EXPECT_EQ(summary(dir.path() / "runs" / name)["steps"], 4);
  }
}

TEST(Distributed, AResumedTwoProcessRunContinuesExactly) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const std::string train = "launch -n 2 -- train --config " + write_config(dir).string();
  ASSERT_EQ(run_ltrain(train + " --set run.name=whole --set run.epochs=2", dir.path() / "whole.log"), 0)
      << read_file(dir.path() / "whole.log");
  ASSERT_EQ(run_ltrain(train + " --set run.name=split --set run.epochs=1", dir.path() / "first.log"), 0)
      << read_file(dir.path() / "first.log");
  ASSERT_EQ(run_ltrain(train + " --set run.name=split --set run.epochs=2 --set checkpoint.resume=auto",
                       dir.path() / "second.log"),
            0)
      << read_file(dir.path() / "second.log");
  EXPECT_NE(read_file(dir.path() / "second.log").find("resuming from"), std::string::npos);
  EXPECT_EQ(model_difference(last_checkpoint(dir.path() / "runs" / "split"), last_checkpoint(dir.path() / "runs" / "whole")),
            0.0);
}

TEST(Distributed, SigtermToTheLauncherCheckpointsEveryRankAndTheRunResumes) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const std::string train = "launch -n 2 -- train --config " + write_config(dir).string() + " --set run.epochs=100000";
  const std::string log = (dir.path() / "launch.log").string();
  // The launcher in the background, its pid kept; SIGTERM once rank 0 has logged steps.
  ASSERT_EQ(std::system(("(" + std::string(LTRAIN_EXECUTABLE) + " " + train + " > '" + log + "' 2>&1 & echo $! > '" +
                         (dir.path() / "launch.pid").string() + "'; wait $!; echo $? > '" +
                         (dir.path() / "launch.code").string() + "') &")
                            .c_str()),
            0);
  const fs::path metrics = dir.path() / "runs" / "run" / "metrics.jsonl";
  ASSERT_TRUE(wait_for_file(metrics, 120)) << read_file(log);
  std::string pid = read_file(dir.path() / "launch.pid");
  pid.erase(pid.find_last_not_of(" \n") + 1);
  ASSERT_EQ(std::system(("kill -TERM " + pid).c_str()), 0);
  ASSERT_TRUE(wait_for_file(dir.path() / "launch.code", 60)) << read_file(log);
  EXPECT_EQ(std::stoi(read_file(dir.path() / "launch.code")), 130) << read_file(log);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("stopped by signal 15 after step"), std::string::npos) << text;
  EXPECT_EQ(text.find("stopping the other processes"), std::string::npos) << text;

  // The same command with resume=auto continues from rank 0's checkpoint to a shorter end.
  const auto checkpoints = testing::files_below(dir.path() / "runs" / "run" / "checkpoints", ".ltc");
  ASSERT_FALSE(checkpoints.empty());
  const int64_t stopped_at = engine::read_checkpoint(checkpoints.back()).meta.step;
  const std::string resume = "launch -n 2 -- train --config " + write_config(dir).string() +
                             " --set run.epochs=100000 --set checkpoint.resume=auto --set run.max_steps=" +
                             std::to_string(stopped_at + 4);
  ASSERT_EQ(run_ltrain(resume, dir.path() / "resume.log"), 0) << read_file(dir.path() / "resume.log");
  EXPECT_NE(read_file(dir.path() / "resume.log").find("resuming from"), std::string::npos);
  EXPECT_EQ(summary(dir.path() / "runs" / "run")["steps"], stopped_at + 4) << read_file(dir.path() / "resume.log");
}

/// The number of step rows rank 0 has written to RUN_DIR/metrics.jsonl.
int64_t metrics_rows(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  int64_t rows = 0;
  for (std::string line; std::getline(in, line);) rows += line.find("\"kind\":\"step\"") != std::string::npos;
  return rows;
}

TEST(Distributed, CtrlCInATerminalStopsEveryRankAtTheSameStepAndTheRunResumesExactly) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const std::string config = write_config(dir).string();
  const std::vector<std::string> run{"launch", "-n", "2", "--", "train", "--config", config,
                                     "--set",  "run.epochs=100000", "--set", "run.max_steps=60"};
  // The launcher in a terminal, as a user starts it; Ctrl-C once rank 0 has logged steps. The
  // terminal sends SIGINT to its foreground process group: the launcher, not the ranks.
  testing::LtrainProcess launcher(run, testing::LtrainProcess::Output::terminal);
  ASSERT_TRUE(testing::wait_until([&] { return metrics_rows(dir.path() / "runs" / "run") >= 2; }, 120))
      << launcher.output();
  launcher.type("\x03");
  EXPECT_EQ(launcher.wait(120), 130) << launcher.output();
  const std::string output = launcher.output();
  EXPECT_EQ(output.find("second signal"), std::string::npos) << output;
  EXPECT_EQ(output.find("stopping the other processes"), std::string::npos) << output;
  // Each rank stopped once, after the same step, where rank 0 wrote its checkpoint.
  const std::regex stopped("stopped by signal 2 after step (\\d+); checkpoint");
  std::vector<int64_t> steps;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), stopped); it != std::sregex_iterator(); ++it)
    steps.push_back(std::stoll((*it)[1]));
  ASSERT_EQ(steps.size(), 2u) << output;
  EXPECT_EQ(steps[0], steps[1]) << output;
  const fs::path run_dir = dir.path() / "runs" / "run";
  const auto found = engine::newest_valid_checkpoint(run_dir / "checkpoints");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.meta.step, steps[0]);
  ASSERT_LT(steps[0], 60) << "the run ended before Ctrl-C";

  // The same command with resume=auto ends where an uninterrupted run does, bit for bit.
  std::string command;
  for (const std::string& word : run) command += word + " ";
  ASSERT_EQ(run_ltrain(command + "--set checkpoint.resume=auto", dir.path() / "resume.log"), 0)
      << read_file(dir.path() / "resume.log");
  ASSERT_EQ(run_ltrain(command + "--set run.name=whole", dir.path() / "whole.log"), 0)
      << read_file(dir.path() / "whole.log");
  EXPECT_EQ(summary(run_dir)["steps"], 60);
  EXPECT_EQ(model_difference(last_checkpoint(run_dir), last_checkpoint(dir.path() / "runs" / "whole")), 0.0);
}

TEST(Distributed, AKilledRankStopsTheOtherWithinTheTimeout) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const std::string train = "train --config " + write_config(dir).string() + " --set run.epochs=100000";
  const RankReaper reaper{dir.path(), 2};
  start_ranks(dir.path(), {train, train});
  // Once rank 0 has logged a step, kill rank 1 without warning.
  ASSERT_TRUE(wait_for_file(dir.path() / "runs" / "run" / "metrics.jsonl", 120))
      << read_file(dir.path() / "rank-0.log");
  ASSERT_TRUE(wait_for_file(dir.path() / "rank-1.pid", 5));
  const std::string pid = read_file(dir.path() / "rank-1.pid");
  ASSERT_EQ(std::system(("kill -9 " + pid).c_str()), 0);
  const auto killed = std::chrono::steady_clock::now();
  // distributed.timeout_s is 20: rank 0 must be gone well before a hang would be noticed.
  EXPECT_EQ(exit_code(dir.path(), 0, 40), 5) << read_file(dir.path() / "rank-0.log");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 30.0);
  const std::string log = read_file(dir.path() / "rank-0.log");
  EXPECT_NE(log.find("rank 0: a collective with the other processes failed"), std::string::npos) << log;
}

TEST(Distributed, ConfigsThatDifferBetweenRanksAreRefused) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const std::string train = "train --config " + write_config(dir).string();
  const RankReaper reaper{dir.path(), 2};
  start_ranks(dir.path(), {train, train + " --set optim.lr=0.5"});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(exit_code(dir.path(), rank, 60), 2) << read_file(dir.path() / ("rank-" + std::to_string(rank) + ".log"));
    EXPECT_NE(read_file(dir.path() / ("rank-" + std::to_string(rank) + ".log"))
                  .find("rank 1's config differs from rank 0's: optim.lr (0.02 -> 0.5)"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(dir.path() / "runs"));  // refused before anything was written
}

TEST(Distributed, BadLauncherInputIsOneLineAndExitCode2) {
  TempDir dir;
  const fs::path log = dir.path() / "log";
  EXPECT_EQ(run_ltrain("launch -- train --config x.json", log), 2);
  EXPECT_NE(read_file(log).find("-n N (the number of processes) is required"), std::string::npos) << read_file(log);
  EXPECT_EQ(run_ltrain("launch -n two -- train", log), 2);
  EXPECT_EQ(run_ltrain("launch -n 2", log), 2);
  EXPECT_NE(read_file(log).find("no command after --"), std::string::npos) << read_file(log);
  const std::string train = "train --config " + write_config(dir).string();
  EXPECT_EQ(run_ltrain("launch -n 1 -- " + train + " --set run.epochs=0", log), 2);  // the child's own exit code
  EXPECT_EQ(std::system(("RANK=2 WORLD_SIZE=2 " + std::string(LTRAIN_EXECUTABLE) + " " + train + " > '" +
                         log.string() + "' 2>&1")
                            .c_str()) >>
                8,
            2);
  EXPECT_NE(read_file(log).find("environment variable RANK=\"2\" is not an integer in 0..1"), std::string::npos)
      << read_file(log);
  // NCCL asked for on the CPU: refused before any rendezvous, with what to use instead.
  EXPECT_EQ(std::system(("RANK=0 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(free_port()) + " " +
                         std::string(LTRAIN_EXECUTABLE) + " " + train + " --set distributed.backend=nccl > '" +
                         log.string() + "' 2>&1")
                            .c_str()) >>
                8,
            2);
  EXPECT_NE(read_file(log).find("distributed.backend \"nccl\" needs CUDA devices and run.device is cpu; use \"gloo\""),
            std::string::npos)
      << read_file(log);
}

TEST(Distributed, AKilledRankMakesTheLauncherExit5WithOneLineNamingIt) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const std::vector<std::string> run{"launch", "-n", "2", "--", "train", "--config", write_config(dir).string(),
                                     "--set", "run.epochs=100000"};
  testing::LtrainProcess launcher(run);
  ASSERT_TRUE(testing::wait_until([&] { return metrics_rows(dir.path() / "runs" / "run") >= 2; }, 120))
      << launcher.output();
  const pid_t rank_1 = child_with_rank(launcher.pid(), 1);
  ASSERT_GT(rank_1, 0) << launcher.output();
  ASSERT_EQ(::kill(rank_1, SIGKILL), 0);
  EXPECT_EQ(launcher.wait(60), 5) << launcher.output();
  const std::string output = launcher.output();
  // The launcher's one line names the rank that failed first, not rank 0 that followed it (exit 5).
  const std::vector<std::string> launcher_lines = lines_with(output, "launch: rank");
  ASSERT_EQ(launcher_lines.size(), 1u) << output;
  EXPECT_NE(launcher_lines[0].find("launch: rank 1 was killed by signal 9 (Killed); the other processes stopped "
                                   "after it; exit code 5 (a process failed)"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("rank 0: a collective with the other processes failed"), std::string::npos) << output;
}

TEST(Distributed, UnderTorchrunsAgentStoreEveryRankConnectsToIt) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  // The test plays torchrun's agent: it serves the TCPStore at the port, so a rank that tried to
  // serve one there too would fail to bind and stop.
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(free_port());
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(60);
  const auto agent_store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  const std::string train = "train --config " + write_config(dir).string();
  const RankReaper reaper{dir.path(), 2};
  start_ranks(dir.path(), {train, train}, options.port,
              "TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=3 LOCAL_WORLD_SIZE=2 GROUP_RANK=0");
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(exit_code(dir.path(), rank, 180), 0) << read_file(dir.path() / ("rank-" + std::to_string(rank) + ".log"));
  EXPECT_EQ(summary(dir.path() / "runs" / "run")["steps"], 4);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = read_file(dir.path() / ("rank-" + std::to_string(rank) + ".log"));
    EXPECT_EQ(log.find("bind"), std::string::npos) << log;
    EXPECT_EQ(log.find("destroy_process_group"), std::string::npos) << log;
  }
  // They met in the agent's store, under this start's prefix.
  EXPECT_TRUE(agent_store->check({"ltrain/start-3/ltrain/config/0", "ltrain/start-3/ltrain/config/1"}));
}

TEST(Distributed, TwoNodesOfOneProcessEachMatchOneProcessWithTheSameGlobalBatch) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  // run.out_dir is relative, and each node runs in a folder of its own: two machines that share
  // no file system.
  write_file(dir.path() / "nodes.json", R"({"extends": ")" + write_config(dir).string() + R"(",
      "run": {"out_dir": "runs"}})");
  const std::string train = " -n 1 -- train --config " + (dir.path() / "nodes.json").string() + " --set run.name=two";
  const std::string master = " --nnodes 2 --master-addr 127.0.0.1 --master-port " + std::to_string(free_port());
  const fs::path node0 = dir.path() / "node0", node1 = dir.path() / "node1";
  auto run_both = [&](const std::string& extra) {
    fs::create_directories(node0);
    fs::create_directories(node1);
    std::string script;
    for (const fs::path& node : {node0, node1}) {
      const std::string rank = node == node0 ? "0" : "1";
      script += "(cd '" + node.string() + "' && timeout 300 " + LTRAIN_EXECUTABLE + " launch" + master +
                " --node-rank " + rank + train + extra + " > launch.log 2>&1; echo $? > launch.code) & ";
    }
    ASSERT_EQ(std::system((script + "wait").c_str()), 0);
  };
  run_both("");
  const std::string log0 = read_file(node0 / "launch.log"), log1 = read_file(node1 / "launch.log");
  ASSERT_EQ(std::stoi(read_file(node0 / "launch.code")), 0) << log0 << log1;
  ASSERT_EQ(std::stoi(read_file(node1 / "launch.code")), 0) << log0 << log1;
  EXPECT_NE(log1.find("launch: node 1 of 2: ranks 1..1 of 2, rendezvous at 127.0.0.1:"), std::string::npos) << log1;
  EXPECT_NE(log1.find("data-parallel: 2 processes (gloo) on 2 nodes, this is node 1, 8 images per process per step"),
            std::string::npos)
      << log1;

  // Only rank 0's node writes the run's files; node 1 logs to its console alone.
  const fs::path two = node0 / "runs" / "two";
  EXPECT_EQ(summary(two)["steps"], 4);
  EXPECT_FALSE(fs::exists(node1 / "runs"));
  // Both nodes end with the same evaluation of the same weights.
  const std::vector<std::string> done0 = lines_with(log0, "done: "), done1 = lines_with(log1, "done: ");
  ASSERT_EQ(done0.size(), 1u) << log0;
  ASSERT_EQ(done1.size(), 1u) << log1;
  const std::string accuracy0 = done0[0].substr(done0[0].find("test accuracy")),
                    accuracy1 = done1[0].substr(done1[0].find("test accuracy"));
  EXPECT_EQ(accuracy0.substr(0, accuracy0.find(" |")), accuracy1.substr(0, accuracy1.find(" |")));

  // The same weights as one process with the global batch (as two processes on one node).
  ASSERT_EQ(run_ltrain_in(dir.path(), "train --config " + (dir.path() / "nodes.json").string() +
                                          " --set run.name=one --set data.batch_size=16",
                          dir.path() / "one.log"),
            0)
      << read_file(dir.path() / "one.log");
  EXPECT_LT(model_difference(last_checkpoint(two), last_checkpoint(dir.path() / "runs" / "one")), 1e-4);

  // Resumed, node 0 finds its checkpoint and node 1 none: refused on both, before any step.
  run_both(" --set run.epochs=2 --set checkpoint.resume=auto");
  for (const fs::path& node : {node0, node1}) {
    EXPECT_EQ(std::stoi(read_file(node / "launch.code")), 2) << read_file(node / "launch.log");
    EXPECT_NE(read_file(node / "launch.log")
                  .find("rank 1 starts at step 0 and rank 0 at step 4 (checkpoint.resume \"auto\"): every process "
                        "must find the same checkpoint"),
              std::string::npos)
        << read_file(node / "launch.log");
  }
  EXPECT_EQ(summary(two)["steps"], 4);
}

TEST(Distributed, ANodeThatCannotReachTheMasterStopsWithOneLineAndExitCode5) {
  SKIP_WITHOUT_GLOO();
  TempDir dir;
  const int64_t port = free_port();  // nothing listens there: node 0 never started
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(run_ltrain("launch --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port " + std::to_string(port) +
                           " -n 1 -- train --config " + write_config(dir).string() + " --set distributed.timeout_s=2",
                       dir.path() / "log"),
            5);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  const std::string log = read_file(dir.path() / "log");
  const std::vector<std::string> errors = lines_with(log, "error");
  ASSERT_EQ(errors.size(), 1u) << log;
  EXPECT_NE(errors[0].find("rank 1: cannot reach the rendezvous at 127.0.0.1:" + std::to_string(port) +
                           " within distributed.timeout_s (2 s)"),
            std::string::npos)
      << log;
}

/// The message of the ConfigError check_launch_options throws for `options`; "" when it throws none.
std::string launch_error_of(const LaunchOptions& options) {
  try {
    check_launch_options(options);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(LaunchOptions, EachOptionIsCheckedAgainstItsRangeAndTheOthers) {
  LaunchOptions two_nodes;
  two_nodes.processes = 2;
  two_nodes.nodes = 2;
  two_nodes.node_rank = 1;
  two_nodes.master_addr = "10.0.0.1";
  two_nodes.master_port = 29500;
  two_nodes.command = {"train", "--config", "C.json"};
  EXPECT_EQ(launch_error_of(two_nodes), "");
  // Each value out of its range, named as ltrain launch spells the option.
  auto with = [&](auto change) {
    LaunchOptions options = two_nodes;
    change(options);
    return launch_error_of(options);
  };
  EXPECT_EQ(with([](LaunchOptions& o) { o.processes = 0; }),
            "ltrain launch: -n 0: expected 1 to 256 processes (one per GPU on a GPU host)");
  EXPECT_EQ(with([](LaunchOptions& o) { o.processes = 257; }),
            "ltrain launch: -n 257: expected 1 to 256 processes (one per GPU on a GPU host)");
  EXPECT_EQ(with([](LaunchOptions& o) { o.nodes = 4097; }), "ltrain launch: --nnodes 4097: expected 1 to 4096 machines");
  EXPECT_EQ(with([](LaunchOptions& o) { o.node_rank = 2; }), "ltrain launch: --node-rank 2 must be in 0..1 (--nnodes 2)");
  EXPECT_EQ(with([](LaunchOptions& o) { o.node_rank = -1; }),
            "ltrain launch: --node-rank -1 must be in 0..1 (--nnodes 2)");
  EXPECT_EQ(with([](LaunchOptions& o) { o.master_port = 65536; }),
            "ltrain launch: --master-port 65536: a TCP port is between 1 and 65535; leave the option out for a free one");
  EXPECT_EQ(with([](LaunchOptions& o) { o.master_port = 0; }),
            "ltrain launch: --master-port 0: a TCP port is between 1 and 65535; leave the option out for a free one");
  EXPECT_EQ(with([](LaunchOptions& o) { o.master_addr = ""; }),
            "ltrain launch: --master-addr needs the address of node 0's machine");
  // Several nodes meet at an address and port all of them are given.
  const std::string meet = "ltrain launch --nnodes 2: give every node the same --master-addr (the address of node 0's "
                           "machine) and --master-port (a free TCP port there)";
  EXPECT_EQ(with([](LaunchOptions& o) { o.master_addr.reset(); }), meet);
  EXPECT_EQ(with([](LaunchOptions& o) { o.master_port.reset(); }), meet);
  EXPECT_EQ(with([](LaunchOptions& o) { o.nodes = 1, o.node_rank = 0, o.master_addr.reset(), o.master_port.reset(); }),
            "");
  EXPECT_EQ(with([](LaunchOptions& o) { o.processes = 256, o.nodes = 257; }),
            "ltrain launch: 257 nodes of 256 processes are more than 65536 processes");
  EXPECT_EQ(with([](LaunchOptions& o) { o.command.clear(); }),
            "ltrain launch: no command after --; for example: ltrain launch -n 2 -- train --config C.json");
}

TEST(LaunchResult, OneRuleForTheLaunchersExitCode) {
  auto exited = [](int64_t rank, int code, bool stopped = false) { return ProcessEnd{rank, code, 0, stopped, false}; };
  // `by_launcher`: its SIGTERM went unheeded, and it sent SIGKILL after the grace period.
  auto killed = [](int64_t rank, int signal, bool by_launcher = false) {
    return ProcessEnd{rank, 0, signal, by_launcher, by_launcher};
  };
  // Every process succeeded, even after a stop signal came too late to matter.
  EXPECT_EQ(launch_result({exited(0, 0), exited(1, 0)}, false).exit_code, 0);
  EXPECT_EQ(launch_result({exited(1, 0), exited(0, 0)}, true).exit_code, 0);
  // Interrupted: 130, the ranks said where they stopped.
  const LaunchResult interrupted = launch_result({exited(0, 130), exited(1, 130)}, true);
  EXPECT_EQ(interrupted.exit_code, 130);
  EXPECT_EQ(interrupted.message, "");
  // A rank killed by a signal, whichever the launcher reaped first (the dead rank after its
  // SIGTERM to it too): 5, naming it.
  for (const auto& ends : {std::vector<ProcessEnd>{killed(1, SIGKILL), exited(0, 5, true)},
                           std::vector<ProcessEnd>{exited(0, 5), ProcessEnd{1, 0, SIGKILL, true, false}}}) {
    const LaunchResult result = launch_result(ends, false);
    EXPECT_EQ(result.exit_code, 5);
    EXPECT_EQ(result.message, "launch: rank 1 was killed by signal 9 (Killed); the other processes stopped after it; "
                              "exit code 5 (a process failed)");
  }
  // Every rank failed alike (a config all reject): that code, and their own lines alone.
  EXPECT_EQ(launch_result({exited(0, 2), exited(1, 2)}, false).exit_code, 2);
  EXPECT_EQ(launch_result({exited(0, 2), exited(1, 2)}, false).message, "");
  // One failed, the other was stopped before it could (exit 130, or killed after the grace period).
  for (const ProcessEnd& stopped : {exited(1, 130, true), killed(1, SIGKILL, true), exited(1, 2, true)}) {
    const LaunchResult result = launch_result({exited(0, 2), stopped}, false);
    EXPECT_EQ(result.exit_code, 2);
  }
  EXPECT_EQ(launch_result({exited(0, 2), exited(1, 130, true)}, false).message,
            "launch: rank 0 exited with code 2 (usage or config error); the other processes stopped after it");
  // A run that failed on one rank (out of memory) and ended the other's collectives.
  const LaunchResult alone = launch_result({exited(2, 4), exited(0, 5), exited(1, 5)}, false);
  EXPECT_EQ(alone.exit_code, 4);
  EXPECT_EQ(alone.message, "launch: rank 2 exited with code 4 (the run failed); the other processes stopped after it");
  // Failures that disagree: 5, naming the first.
  const LaunchResult differ = launch_result({exited(1, 3), exited(0, 4)}, false);
  EXPECT_EQ(differ.exit_code, 5);
  EXPECT_EQ(differ.message, "launch: rank 1 exited with code 3 (data error); the other processes stopped after it; "
                            "exit code 5 (a process failed)");
  // Every rank lost the others (none reached the rendezvous): 5, their lines say why.
  EXPECT_EQ(launch_result({exited(0, 5), exited(1, 5)}, false).exit_code, 5);
  EXPECT_EQ(launch_result({exited(0, 5), exited(1, 5)}, false).message, "");
  // A rank the launcher stopped that failed its own way still counts.
  EXPECT_EQ(launch_result({exited(0, 4), exited(1, 3, true)}, false).exit_code, 5);
}

/// Sets environment variables for one test and restores them after.
class ScopedVariables {
 public:
  explicit ScopedVariables(const std::vector<std::pair<std::string, std::string>>& variables) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                             "TORCHELASTIC_RESTART_COUNT"}) {
      if (const char* value = std::getenv(name)) saved_.emplace_back(name, value);
      ::unsetenv(name);
      names_.push_back(name);
    }
    for (const auto& [name, value] : variables) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedVariables() {
    for (const std::string& name : names_) ::unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST(DistEnvironment, TorchrunsVariablesOfSeveralNodes) {
  {
    const ScopedVariables variables({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                     {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"},
                                     {"MASTER_PORT", "29400"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                     {"TORCHELASTIC_RESTART_COUNT", "2"}});
    const std::optional<Environment> e = read_environment();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->rank, 5);
    EXPECT_EQ(e->world_size, 8);
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_EQ(e->local_world_size, 4);
    EXPECT_EQ(e->node_rank, 1);
    EXPECT_EQ(e->master_addr, "10.0.0.1");
    EXPECT_EQ(e->master_port, 29400);
    EXPECT_TRUE(e->agent_store);
    EXPECT_EQ(e->restart_count, 2);
  }
  {
    // By hand on one machine: LOCAL_RANK defaults to RANK, one node of WORLD_SIZE; NODE_RANK is read too.
    const ScopedVariables variables({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"NODE_RANK", "0"},
                                     {"TORCHELASTIC_USE_AGENT_STORE", "False"}});
    const std::optional<Environment> e = read_environment();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_EQ(e->local_world_size, 2);
    EXPECT_EQ(e->node_rank, 0);
    EXPECT_FALSE(e->agent_store);
  }
  {
    const ScopedVariables variables({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
    try {
      read_environment();
      FAIL() << "LOCAL_RANK 2 of 2 was accepted";
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).rfind("environment variable LOCAL_RANK=\"2\" is not an integer in 0..1", 0), 0u)
          << error.what();
    }
  }
  {
    const ScopedVariables variables({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "yes"}});
    EXPECT_THROW(read_environment(), ConfigError);
  }
}

#if LTRAIN_WITH_NCCL
/// Collects LibTorch's warnings (TORCH_WARN) raised on this thread while it is the handler.
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};
#endif

TEST(Group, NcclIsShutDownOrAbortedBeforeItIsDestroyed_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if !LTRAIN_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  WarningCollector warnings;
  const c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  TORCH_WARN("collected");  // the handler sees this thread's warnings
  // A process group of one rank: the end of a run (close), then the way out of an error (abort).
  for (const bool closed : {true, false}) {
    Environment environment;
    environment.master_port = free_port();
    GroupOptions options = engine::group_options(config::DistributedSection{});
    options.backend = config::DistBackend::nccl;
    options.timeout_s = 60;
    auto group = std::make_unique<Group>(environment, options, torch::Device(torch::kCUDA, 0));
    torch::Tensor values = torch::ones({4}, torch::TensorOptions().device(torch::kCUDA, 0));
    group->all_reduce_sum({values}).wait();
    EXPECT_TRUE(torch::equal(values.cpu(), torch::ones({4})));
    if (closed) group->close();
    group.reset();
  }
  ASSERT_FALSE(warnings.messages.empty());
  EXPECT_EQ(warnings.messages.front(), "collected");
  // LibTorch 2.4 and later warn when a ProcessGroupNCCL is destroyed without shutdown or abort.
  for (const std::string& message : warnings.messages) {
    EXPECT_EQ(message.find("destroy_process_group"), std::string::npos) << message;
    EXPECT_EQ(message.find("has NOT been destroyed"), std::string::npos) << message;
  }
#endif
}

}  // namespace
}  // namespace ltrain::dist
