// The ltrain executable as a user meets it: help texts, exit codes, one-line errors.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "ltrain/io/tensor_file.h"
#include "support.h"

namespace ltrain {
namespace {

using testing::read_file;
using testing::run_ltrain;
using testing::TempDir;
using testing::write_file;

TEST(Cli, HelpListsCommandsAndOptionsWithDefaults) {
  TempDir dir;
  EXPECT_EQ(run_ltrain("--help", dir.path() / "out"), 0);
  const std::string top = read_file(dir.path() / "out");
  for (const char* command : {"train", "eval", "export", "bench"}) EXPECT_NE(top.find(command), std::string::npos);
  EXPECT_EQ(run_ltrain("train --help", dir.path() / "out"), 0);
  const std::string train = read_file(dir.path() / "out");
  EXPECT_NE(train.find("--config"), std::string::npos);
  EXPECT_NE(train.find("optim.lr"), std::string::npos);
  EXPECT_NE(train.find("(default 0.1)"), std::string::npos);
  EXPECT_EQ(run_ltrain("bench step --help", dir.path() / "out"), 0);
  EXPECT_NE(read_file(dir.path() / "out").find("(default: 50)"), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(run_ltrain("", dir.path() / "out"), 2);
  EXPECT_EQ(run_ltrain("fly", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("unknown command \"fly\""), std::string::npos);
  EXPECT_EQ(run_ltrain("train", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("ltrain train needs --config"), std::string::npos);
  EXPECT_EQ(run_ltrain("train --config x.json --bogus", dir.path() / "out"), 2);
}

TEST(Cli, ConfigErrorIsOneLineAndExitsTwo) {
  TempDir dir;
  write_file(dir.path() / "bad.json", R"({"optim": {"lr": -1}})");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "bad.json").string(), dir.path() / "out"), 2);
  const std::string out = read_file(dir.path() / "out");
  EXPECT_NE(out.find((dir.path() / "bad.json").string() + ": optim.lr = -1: expected a number > 0 and <= 1000"),
            std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

TEST(Cli, MissingDataExitsThreeAndCreatesNoRun) {
  TempDir dir;
  write_file(dir.path() / "c.json",
             R"({"run": {"out_dir": ")" + (dir.path() / "runs").string() + R"("}, "data": {"root": "/nonexistent"}})");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), dir.path() / "out"), 3);
  const std::string out = read_file(dir.path() / "out");
  EXPECT_NE(out.find("/nonexistent/data_batch_1.bin"), std::string::npos) << out;
  EXPECT_NE(out.find("scripts/get-cifar10.sh"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs" / "run"));
}

TEST(Cli, BatchLargerThanTheDataNamesTheKeyAndFile) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({"data": {"source": "synthetic", "synthetic_train_size": 100, "batch_size": 128}})");
  EXPECT_EQ(run_ltrain("bench step --config " + (dir.path() / "c.json").string(), dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find((dir.path() / "c.json").string() +
                                                ": data.batch_size = 128: larger than the training set (100 images); "
                                                "use a smaller batch"),
            std::string::npos)
      << read_file(dir.path() / "out");
}

TEST(Cli, PrecisionTheCpuCannotRunIsAConfigError) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({"run": {"device": "cpu"}, "precision": {"mode": "fp16"}})");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out")
                .find("precision.mode = \"fp16\": fp16 autocast needs a CUDA device; on the CPU use \"bf16\" (CPU "
                      "autocast) or \"fp32\""),
            std::string::npos)
      << read_file(dir.path() / "out");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string() + " --set precision.mode=fp32 --set "
                       "precision.tf32=true",
                       dir.path() / "out"),
            2);
  EXPECT_NE(read_file(dir.path() / "out").find("--set precision.tf32=true: precision.tf32 = true: TF32 is a feature"),
            std::string::npos)
      << read_file(dir.path() / "out");
}

TEST(Cli, CudaGraphsOnTheCpuAreAConfigError) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({"run": {"device": "cpu", "out_dir": ")" + (dir.path() / "runs").string() +
                                        R"("}, "cuda_graph": {"train": true}})");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out")
                .find("cuda_graph.train = true: CUDA graphs need a CUDA device and run.device is cpu; set it to false, "
                      "or run on a GPU with a CUDA build of ltrain"),
            std::string::npos)
      << read_file(dir.path() / "out");
  EXPECT_EQ(run_ltrain("bench step --config " + (dir.path() / "c.json").string() +
                           " --set cuda_graph.train=false --set cuda_graph.eval=true",
                       dir.path() / "out"),
            2);
  EXPECT_NE(read_file(dir.path() / "out").find("cuda_graph.eval = true: CUDA graphs need a CUDA device"),
            std::string::npos)
      << read_file(dir.path() / "out");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));  // refused before a run directory exists
}

TEST(Cli, CpuBuildRefusesCudaDevice) {
  if (LTRAIN_WITH_CUDA) GTEST_SKIP() << "CUDA build";
  TempDir dir;
  write_file(dir.path() / "c.json", R"({"run": {"device": "cuda"}})");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("run.device = \"cuda\": this ltrain was built against a CPU-only LibTorch"),
            std::string::npos);
}

TEST(Cli, BadCheckpointExitsThree) {
  TempDir dir;
  write_file(dir.path() / "junk.ltc", "junk");
  EXPECT_EQ(run_ltrain("eval --checkpoint " + (dir.path() / "junk.ltc").string(), dir.path() / "out"), 3);
  EXPECT_NE(read_file(dir.path() / "out").find("not an ltrain checkpoint"), std::string::npos);
  EXPECT_EQ(run_ltrain("export --checkpoint " + (dir.path() / "none.ltc").string() + " --out x.safetensors",
                       dir.path() / "out"),
            3);
}

TEST(Cli, TrainEvalExportOnSyntheticData) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({
    "run": {"out_dir": ")" + (dir.path() / "runs").string() + R"(", "name": "cli", "epochs": 1, "device": "cpu"},
    "model": {"arch": "resnet18", "width": 4},
    "data": {"source": "synthetic", "synthetic_train_size": 128, "synthetic_test_size": 50, "batch_size": 64}})");
  ASSERT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), dir.path() / "train.out"), 0)
      << read_file(dir.path() / "train.out");
  const auto checkpoint = dir.path() / "runs" / "cli" / "checkpoints" / "step-00000002.ltc";
  ASSERT_TRUE(std::filesystem::exists(checkpoint));

  ASSERT_EQ(run_ltrain("eval --json --checkpoint " + checkpoint.string(), dir.path() / "eval.out"), 0)
      << read_file(dir.path() / "eval.out");
  const std::string eval_out = read_file(dir.path() / "eval.out");
  const auto result = nlohmann::json::parse(eval_out.substr(eval_out.find('{')));
  EXPECT_EQ(result["images"], 50);
  EXPECT_EQ(result["step"], 2);

  const auto weights = dir.path() / "w.safetensors";
  ASSERT_EQ(run_ltrain("export --checkpoint " + checkpoint.string() + " --out " + weights.string(), dir.path() / "x.out"),
            0);
  std::map<std::string, std::string> metadata;
  const io::NamedTensors tensors = io::read_safetensors(weights, &metadata);
  EXPECT_EQ(tensors.front().first, "conv1.weight");
  EXPECT_EQ(tensors.back().first, "fc.bias");
  EXPECT_EQ(metadata.at("model.arch"), "resnet18");
  EXPECT_EQ(metadata.at("format"), "pt");
}

TEST(Cli, BenchStepReportsTimesAndSettings) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({
    "run": {"device": "cpu"},
    "model": {"arch": "resnet18", "width": 4, "checkpoint_segments": 2},
    "data": {"source": "synthetic", "synthetic_train_size": 64, "synthetic_test_size": 10, "batch_size": 16}})");
  const std::string bench = "bench step --json --warmup 1 --steps 3 --config " + (dir.path() / "c.json").string();
  ASSERT_EQ(run_ltrain(bench, dir.path() / "out"), 0) << read_file(dir.path() / "out");
  const std::string out = read_file(dir.path() / "out");
  const auto result = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(result["arch"], "resnet18");
  EXPECT_EQ(result["batch_size"], 16);
  EXPECT_EQ(result["steps"], 3);
  EXPECT_EQ(result["checkpoint_segments"], 2);
  EXPECT_GT(result["host_ms_per_step"].get<double>(), 0.0);
  // Issuing the steps cannot take longer than issuing them and waiting for them.
  EXPECT_LE(result["host_ms_per_step"].get<double>(), result["ms_per_step"].get<double>());
  const double images_per_second = 16 * 1000.0 / result["ms_per_step"].get<double>();
  EXPECT_NEAR(result["images_per_second"].get<double>(), images_per_second, 1e-9 * images_per_second);
  EXPECT_TRUE(std::isfinite(result["final_loss"].get<double>()));

  // --profile writes a Chrome trace, or, where this LibTorch has no Kineto (Debian's), says so
  // before any step runs: exit 4, one line, no trace.
  const auto trace = dir.path() / "trace.json";
  const int profiled = run_ltrain(bench + " --profile " + trace.string(), dir.path() / "profile.out");
  const std::string profile_out = read_file(dir.path() / "profile.out");
  if (profiled == 0) {
    const auto events = nlohmann::json::parse(read_file(trace))["traceEvents"];
    const bool has_convolution = std::any_of(events.begin(), events.end(), [](const nlohmann::json& e) {
      return e.value("name", "") == "aten::convolution";
    });
    EXPECT_TRUE(has_convolution);
  } else {
    EXPECT_EQ(profiled, 4) << profile_out;
    EXPECT_NE(profile_out.find("run without --profile"), std::string::npos) << profile_out;
    EXPECT_EQ(profile_out.find("\"images_per_second\""), std::string::npos) << profile_out;
  }
}

}  // namespace
}  // namespace ltrain
