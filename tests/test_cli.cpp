// The ltrain executable as a user meets it: help texts, exit codes, one-line errors.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ltrain/io/tensor_file.h"
#include "support.h"

namespace ltrain {
namespace {

using testing::read_file;
using testing::run_ltrain;
using testing::run_ltrain_within;
using testing::TempDir;
using testing::write_file;

::testing::AssertionResult one_line_with(const std::filesystem::path& log, const std::string& text);

TEST(Cli, HelpListsCommandsAndOptionsWithDefaults) {
  TempDir dir;
  EXPECT_EQ(run_ltrain("--help", dir.path() / "out"), 0);
  const std::string top = read_file(dir.path() / "out");
  for (const char* command : {"train", "eval", "export", "bench"}) EXPECT_NE(top.find(command), std::string::npos);
  EXPECT_NE(top.find("ltrain --version"), std::string::npos) << top;
  EXPECT_EQ(run_ltrain("train --help", dir.path() / "out"), 0);
  const std::string train = read_file(dir.path() / "out");
  EXPECT_NE(train.find("--config"), std::string::npos);
  EXPECT_NE(train.find("optim.lr"), std::string::npos);
  // optim.lr's line, and the next that continues its description.
  EXPECT_NE(train.find("  optim.lr                      peak learning rate; the schedule scales it (number > 0 and <= "
                       "1000, default\n                                0.1)"),
            std::string::npos)
      << train;
  EXPECT_EQ(run_ltrain("bench step --help", dir.path() / "out"), 0);
  EXPECT_NE(read_file(dir.path() / "out").find("(default: 50)"), std::string::npos);
}

TEST(Cli, ConfigSchemaIsJsonSchemaOfEveryKey) {
  TempDir dir;
  ASSERT_EQ(run_ltrain("config --schema", dir.path() / "out"), 0) << read_file(dir.path() / "out");
  const auto schema = nlohmann::json::parse(read_file(dir.path() / "out"));
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(schema["properties"]["precision"]["properties"]["mode"]["enum"],
            nlohmann::json::parse(R"(["fp32", "tf32", "fp16", "bf16"])"));
  EXPECT_EQ(run_ltrain("config", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "ltrain config needs --schema; see ltrain config --help"));
}

/// The words a shell's completion offers for the command line `line` (cursor at its end), from the
/// script `script` run by `shell` ("bash" with a COMP_LINE; "zsh" with its completion builtins
/// replaced by ones that print what they were given).
std::string completed(const std::filesystem::path& script, const std::string& shell, const std::string& line,
                      const TempDir& dir) {
  const auto driver = dir.path() / ("driver." + shell);
  const auto out = dir.path() / "completed";
  if (shell == "bash") {
    write_file(driver, "source '" + script.string() + "'\nCOMP_LINE='" + line + "'\nCOMP_POINT=${#COMP_LINE}\n"
                       "_ltrain\necho \"${COMPREPLY[*]}\"\n");
  } else {
    write_file(driver,
               "compdef() { :; }\n"
               "compadd() { if [[ $1 == -a ]]; then print -r -- \"${(P)2}\"; else shift; print -r -- \"$*\"; fi }\n"
               "_describe() { while [[ $1 == -t ]]; do shift 2; done; print -r -- \"${(P)2}\"; }\n"
               "_files() { print -r -- files; }\n"
               "compset() { [[ $1 == -P && ${words[CURRENT]} == *=* ]] || return 1; IPREFIX=${words[CURRENT]%%=*}=; }\n"
               "source '" + script.string() + "'\n"
               "words=(${(z)LINE}); [[ $LINE == *' ' ]] && words+=(''); CURRENT=${#words}\n_ltrain\n");
  }
  const int status = std::system(("LINE='" + line + "' " + shell + " " + driver.string() + " > " + out.string() +
                                  " 2>&1").c_str());
  EXPECT_EQ(status, 0) << read_file(out);
  std::string words = read_file(out);
  while (!words.empty() && words.back() == '\n') words.pop_back();
  return words;
}

TEST(Cli, CompletionScriptsOfferCommandsOptionsKeysAndValues) {
  TempDir dir;
  const auto script = dir.path() / "ltrain.bash";
  ASSERT_EQ(run_ltrain("completion bash", script), 0) << read_file(script);
  const std::string bash = read_file(script);
  EXPECT_NE(bash.find("\n_ltrain() {\n"), std::string::npos);
  EXPECT_NE(bash.find("\ncomplete -F _ltrain ltrain\n"), std::string::npos);
  EXPECT_NE(bash.find("_ltrain_commands='train eval export bench doctor sweep reproduce launch config completion'"),
            std::string::npos);
  const auto keys_at = bash.find("\n_ltrain_keys='");
  ASSERT_NE(keys_at, std::string::npos);
  const std::string keys = " " + bash.substr(keys_at + 15, bash.find('\'', keys_at + 15) - keys_at - 15) + " ";
  for (const config::KeyInfo& key : config::config_keys().keys)
    EXPECT_NE(keys.find(" " + key.name + " "), std::string::npos) << key.name;
  // What bash offers, read from the options --help lists and the config keys.
  EXPECT_EQ(completed(script, "bash", "ltrain ", dir),
            "train eval export bench doctor sweep reproduce launch config completion --help --version");
  EXPECT_EQ(completed(script, "bash", "ltrain train --d", dir), "--dry-run");
  EXPECT_EQ(completed(script, "bash", "ltrain train --set optim.l", dir), "optim.lr=");
  EXPECT_EQ(completed(script, "bash", "ltrain train --config c.json precision.mo", dir), "precision.mode=");
  EXPECT_EQ(completed(script, "bash", "ltrain train precision.mode=b", dir), "bf16");
  EXPECT_EQ(completed(script, "bash", "ltrain eval --set model.channels_last=", dir), "true false");
  EXPECT_EQ(completed(script, "bash", "ltrain bench ", dir), "step matmul --help");
  EXPECT_EQ(completed(script, "bash", "ltrain bench step --st", dir), "--steps");
  EXPECT_EQ(completed(script, "bash", "ltrain bench step --steps ", dir), "");
  EXPECT_EQ(completed(script, "bash", "ltrain completion ", dir), "bash zsh");
  EXPECT_EQ(completed(script, "bash", "ltrain launch -n 2 -- sweep --dry", dir), "--dry-run");
  write_file(dir.path() / "runs.json", "{}");
  EXPECT_EQ(completed(script, "bash", "ltrain train --config " + (dir.path() / "runs.j").string(), dir),
            (dir.path() / "runs.json").string());
  EXPECT_EQ(completed(script, "bash", "ltrain export optim.l", dir), "");  // export takes no overrides

  const auto zsh_script = dir.path() / "_ltrain";
  ASSERT_EQ(run_ltrain("completion zsh", zsh_script), 0) << read_file(zsh_script);
  const std::string zsh = read_file(zsh_script);
  EXPECT_EQ(zsh.substr(0, 16), "#compdef ltrain\n");
  EXPECT_NE(zsh.find("\n_ltrain() {\n"), std::string::npos);
  EXPECT_NE(zsh.find("compdef _ltrain ltrain"), std::string::npos);
  for (const config::KeyInfo& key : config::config_keys().keys)
    EXPECT_NE(zsh.find("'" + key.name + ":"), std::string::npos) << key.name;
  if (std::system("command -v zsh > /dev/null 2>&1") == 0) {
    EXPECT_EQ(std::system(("zsh -n " + zsh_script.string()).c_str()), 0);
    EXPECT_EQ(completed(zsh_script, "zsh", "ltrain train precision.mode=", dir), "fp32 tf32 fp16 bf16");
    EXPECT_EQ(completed(zsh_script, "zsh", "ltrain completion ", dir), "bash zsh");
    EXPECT_EQ(completed(zsh_script, "zsh", "ltrain train --config ", dir), "files");
    const std::string options = completed(zsh_script, "zsh", "ltrain train --", dir);
    EXPECT_NE(options.find("--dry-run:check the config"), std::string::npos) << options;
  }

  EXPECT_EQ(run_ltrain("completion fish", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "ltrain completion fish: no script for this shell; use bash or zsh"));
  EXPECT_EQ(run_ltrain("completion", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "ltrain completion needs the shell: ltrain completion bash, or ltrain "
                                                "completion zsh"));
}

TEST(Cli, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(run_ltrain("", dir.path() / "out"), 2);
  EXPECT_EQ(run_ltrain("fly", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("unknown command \"fly\""), std::string::npos);
  EXPECT_EQ(run_ltrain("train", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("ltrain train needs --config"), std::string::npos);
  EXPECT_EQ(run_ltrain("train --config x.json --bogus", dir.path() / "out"), 2);
  EXPECT_EQ(run_ltrain("bench", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "ltrain bench needs one of: step, matmul; see ltrain bench --help"));
  EXPECT_EQ(run_ltrain("bench fly", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "unknown command \"ltrain bench fly\"; use one of: step, matmul"));
  EXPECT_EQ(run_ltrain("bench --help", dir.path() / "out"), 0);
  EXPECT_NE(read_file(dir.path() / "out").find("bench matmul"), std::string::npos);
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

/// A tiny CPU run on synthetic data in `dir`/c.json, one step long.
std::string tiny_config(const TempDir& dir) {
  write_file(dir.path() / "c.json", R"({
    "run": {"out_dir": ")" + (dir.path() / "runs").string() + R"(", "epochs": 1, "max_steps": 1, "device": "cpu"},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4},
    "data": {"source": "synthetic", "synthetic_train_size": 32, "synthetic_test_size": 8, "batch_size": 8}})");
  return (dir.path() / "c.json").string();
}

/// Whether `log` is one line that holds `text`.
::testing::AssertionResult one_line_with(const std::filesystem::path& log, const std::string& text) {
  const std::string out = read_file(log);
  if (out.find(text) == std::string::npos) return ::testing::AssertionFailure() << "no \"" << text << "\" in: " << out;
  if (std::count(out.begin(), out.end(), '\n') != 1) return ::testing::AssertionFailure() << "not one line: " << out;
  return ::testing::AssertionSuccess();
}

TEST(Cli, ConfigsThatCrashedOrHungEndWithOneLineAndExitTwo) {
  TempDir dir;
  const std::string config = tiny_config(dir);
  const auto log = dir.path() / "out";
  std::string objects;
  for (int i = 0; i < 20000; ++i) objects += "{\"run\":";
  write_file(dir.path() / "deep.json", objects + "1" + std::string(20000, '}'));
  EXPECT_EQ(run_ltrain_within(20, "train --config " + (dir.path() / "deep.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, "line 1, column 225: objects and lists nested more than 32 deep"));
  write_file(dir.path() / "arrays.json", std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_EQ(run_ltrain_within(20, "train --config " + (dir.path() / "arrays.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, "line 1, column 33: objects and lists nested more than 32 deep"));
  // A NUL in run.name used to loop for ever looking for a free run folder.
  write_file(dir.path() / "nul.json", R"({"extends": "c.json", "run": {"name": "\u0000"}})");
  EXPECT_EQ(run_ltrain_within(20, "train --config " + (dir.path() / "nul.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, "run.name = \"\\u0000\": a NUL character (\\u0000) cannot be part of a setting"));
  // "extends" naming a FIFO (waits for a writer) or /dev/zero (never ends).
  ASSERT_EQ(::mkfifo((dir.path() / "pipe").c_str(), 0600), 0);
  write_file(dir.path() / "fifo.json", R"({"extends": "pipe"})");
  EXPECT_EQ(run_ltrain_within(20, "train --config " + (dir.path() / "fifo.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, "pipe: is a FIFO (named pipe), not a file (paths are relative to this file)"));
  write_file(dir.path() / "zero.json", R"({"extends": "/dev/zero"})");
  EXPECT_EQ(run_ltrain_within(20, "train --config " + (dir.path() / "zero.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, "/dev/zero: is a character device, not a file"));
  EXPECT_EQ(run_ltrain_within(20, "train --config " + dir.path().string(), log), 2);
  EXPECT_TRUE(one_line_with(log, dir.path().string() + ": is a directory, not a file; give the path of a run config"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
}

TEST(Cli, ValuesPastWhatTheCodeHoldsExitTwoNotOne) {
  TempDir dir;
  const std::string train = "train --config " + tiny_config(dir) + " --set ";
  const auto log = dir.path() / "out";
  const auto refused = [&](const std::string& spec, const std::string& message) {
    EXPECT_EQ(run_ltrain_within(20, train + "'" + spec + "'", log), 2) << spec << ": " << read_file(log);
    EXPECT_TRUE(one_line_with(log, message)) << spec;
  };
  refused("run.name=\xff", "--set run.name=\\xFF: not valid UTF-8; write the setting in UTF-8");
  refused("data.eval_batch_size=9223372036854775807",
          "data.eval_batch_size = 9223372036854775807: expected an integer between 1 and 4194304");
  refused("model.width=9223372036854775807", "model.width = 9223372036854775807: expected an integer between 1 and 256");
  refused("model.num_classes=2147483648", "model.num_classes = 2147483648: expected an integer between 2 and 100000");
  refused("data.synthetic_train_size=9223372036854775807",
          "data.synthetic_train_size = 9223372036854775807: expected an integer between 1 and 4194304");
  refused("schedule.final_div_factor=1e-308",
          "schedule.final_div_factor = 1e-308: expected a number between 1 and 1000000000");
  refused("optim.lr=1e999", "optim.lr = 1e999: the number is out of range");
  refused("model.init_from=" + std::string(300, 'w'),
          "a file or folder name in this path is longer than 255 bytes; use a shorter path");
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  refused("run.threads=4294967297",
          fmt::format("--set run.threads=4294967297: run.threads = 4294967297: this machine has {} CPU cores; use at "
                      "most {} threads (0: one per core)",
                      cores, 4 * cores));
  // "Target 9 is out of bounds" at the first step, before: the data's ten classes are checked at start.
  refused("model.num_classes=5",
          "--set model.num_classes=5: model.num_classes = 5: the data has 10 classes (labels 0 to 9); use at least 10");
  EXPECT_EQ(run_ltrain_within(20, "bench step --warmup 0 --steps 1 --config " + (dir.path() / "c.json").string() +
                                      " --set model.num_classes=9",
                              log),
            2);
  EXPECT_TRUE(one_line_with(log, "model.num_classes = 9: the data has 10 classes"));
  write_file(dir.path() / "big.json", R"({"extends": "c.json", "optim": {"lr": 1e999}})");
  EXPECT_EQ(run_ltrain_within(20, "train --config " + (dir.path() / "big.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, (dir.path() / "big.json").string() + ": optim.lr = 1e999: the number is out of range"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
}

TEST(Cli, SetTakesJsonListsAndObjects) {
  TempDir dir;
  const std::string print = "train --print-config --config " + tiny_config(dir);
  ASSERT_EQ(run_ltrain(print + R"( --set data.mean=[0.5,0.25,0.125] --set 'optim={"lr":0.05,"momentum":0.8}')",
                       dir.path() / "out"),
            0)
      << read_file(dir.path() / "out");
  const std::string out = read_file(dir.path() / "out");
  const auto printed = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(printed["data"]["mean"], nlohmann::json({0.5, 0.25, 0.125}));
  EXPECT_EQ(printed["optim"]["lr"], 0.05);
  EXPECT_EQ(printed["optim"]["momentum"], 0.8);
}

TEST(Cli, BareKeyValueArgumentsOverrideInOrderWithSet) {
  TempDir dir;
  const std::string print = "train --print-config --config " + tiny_config(dir);
  const auto log = dir.path() / "out";
  // Hydra's style beside --set, applied in the order given: the last value of a key wins.
  ASSERT_EQ(run_ltrain(print + " optim.lr=0.05 --set optim.lr=0.07 data.batch_size=4 'optim={\"momentum\":0.8}' "
                               "--set optim.momentum=0.7 data.mean=[0.5,0.25,0.125]",
                       log),
            0)
      << read_file(log);
  const auto printed = nlohmann::json::parse(read_file(log));
  EXPECT_EQ(printed["optim"]["lr"], 0.07);
  EXPECT_EQ(printed["data"]["batch_size"], 4);
  EXPECT_EQ(printed["optim"]["momentum"], 0.7);
  EXPECT_EQ(printed["data"]["mean"], nlohmann::json({0.5, 0.25, 0.125}));
  ASSERT_EQ(run_ltrain(print + " optim.lr=0.3 --set optim.lr=0.2 optim.lr=0.1", log), 0) << read_file(log);
  EXPECT_EQ(nlohmann::json::parse(read_file(log))["optim"]["lr"], 0.1);

  // Anything else is named, with what to do.
  EXPECT_EQ(run_ltrain(print + " configs/quickstart.json", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain train: unexpected argument \"configs/quickstart.json\"; arguments besides "
                                 "options are config overrides KEY=VALUE, e.g. optim.lr=0.05 (see ltrain train --help)"));
  EXPECT_EQ(run_ltrain(print + " optim.lrr=0.1", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain train: argument \"optim.lrr=0.1\": \"optim.lrr\" is not a config key; ltrain "
                                 "train --help lists them"));
  EXPECT_EQ(run_ltrain(print + " =0.1", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain train: unexpected argument \"=0.1\""));
  // A value the key cannot take is the config reader's error, as with --set.
  EXPECT_EQ(run_ltrain(print + " optim.lr=-1", log), 2);
  EXPECT_TRUE(one_line_with(log, "--set optim.lr=-1: optim.lr = -1: expected a number > 0 and <= 1000"));
  // The other commands that take overrides take them bare too; those that take none refuse them.
  EXPECT_EQ(run_ltrain("bench step --warmup 0 --steps 1 --json --config " + (dir.path() / "c.json").string() +
                           " data.batch_size=4",
                       log),
            0)
      << read_file(log);
  const std::string bench = read_file(log);
  EXPECT_EQ(nlohmann::json::parse(bench.substr(bench.find('{')))["batch_size"], 4);
  EXPECT_EQ(run_ltrain("export --checkpoint c.ltc --out x.safetensors optim.lr=0.1", log), 2);
  EXPECT_TRUE(one_line_with(log, "unexpected argument \"optim.lr=0.1\"; see ltrain export --help"));
}

TEST(Cli, TrainDryRunChecksEverythingAStartChecksAndWritesNothing) {
  TempDir dir;
  const std::string config = tiny_config(dir);
  const auto log = dir.path() / "out";
  ASSERT_EQ(run_ltrain("train --dry-run --config " + config, log), 0) << read_file(log);
  const std::string out = read_file(log);
  const std::string start = "dry run: resnet18 (cifar stem, width 4): ";
  EXPECT_EQ(out.substr(0, start.size()), start) << out;
  EXPECT_NE(out.find(" parameters | synthetic: 32 training, 8 test images | 4 steps per epoch of 8 images, 1 steps in "
                     "1 epoch(s) | device cpu; nothing was written\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
  // The parameters are the model's: the same count a run logs.
  ASSERT_EQ(run_ltrain("train --config " + config + " run.out_dir=" + (dir.path() / "real").string(),
                       dir.path() / "train.out"),
            0);
  const std::string parameters = out.substr(start.size(), out.find(" parameters") - start.size());
  EXPECT_NE(read_file(dir.path() / "train.out").find(": " + parameters + " parameters"), std::string::npos)
      << parameters;

  // Bad input fails as the run would, with its exit code, before anything is written.
  EXPECT_EQ(run_ltrain("train --dry-run --config " + config + " data.batch_size=64", log), 2);
  EXPECT_TRUE(one_line_with(log, "data.batch_size = 64: larger than the training set (32 images)"));
  EXPECT_EQ(run_ltrain("train --dry-run --config " + config + " data.source=cifar10 data.root=/nonexistent", log), 3);
  EXPECT_NE(read_file(log).find("/nonexistent/data_batch_1.bin"), std::string::npos) << read_file(log);
  EXPECT_EQ(run_ltrain("train --dry-run --config " + config + " checkpoint.resume=/nonexistent.ltc", log), 2);
  EXPECT_TRUE(one_line_with(log, "checkpoint.resume = \"/nonexistent.ltc\": no such checkpoint file"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
}

TEST(Cli, CheckpointsAndOutputsThatAreNotRegularFilesAreRefused) {
  TempDir dir;
  const auto log = dir.path() / "out";
  ASSERT_EQ(::mkfifo((dir.path() / "pipe").c_str(), 0600), 0);
  const std::string pipe = (dir.path() / "pipe").string();
  const std::string hint = "; give the path of a checkpoint file (RUN/checkpoints/step-N.ltc)";
  for (const std::string command : {"eval --checkpoint ", "export --out x.safetensors --checkpoint "}) {
    EXPECT_EQ(run_ltrain_within(20, command + dir.path().string(), log), 3) << command;
    EXPECT_TRUE(one_line_with(log, dir.path().string() + ": is a directory, not a file" + hint));
    EXPECT_EQ(run_ltrain_within(20, command + pipe, log), 3) << command;
    EXPECT_TRUE(one_line_with(log, pipe + ": is a FIFO (named pipe), not a file" + hint));
  }
  // export writes only regular files: a FIFO or a directory at --out stays what it is.
  EXPECT_EQ(run_ltrain_within(20, "export --checkpoint none.ltc --out " + pipe, log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain export --out " + pipe +
                                     ": is a FIFO (named pipe), not a file; give the path of a new or regular file "
                                     "(.safetensors)"));
  struct stat info {};
  ASSERT_EQ(::stat(pipe.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  EXPECT_EQ(run_ltrain_within(20, "export --checkpoint none.ltc --out " + dir.path().string(), log), 2);
  EXPECT_TRUE(one_line_with(log, ": is a directory, not a file; give the path of a new or regular file"));
}

TEST(Cli, LaunchRefusesPortsAndProcessCountsOutOfRange) {
  TempDir dir;
  const auto log = dir.path() / "out";
  EXPECT_EQ(run_ltrain_within(20, "launch -n 1 --master-port 99999 -- train --print-config --config x.json", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain launch: --master-port 99999: a TCP port is between 1 and 65535; leave the "
                                 "option out for a free one"));
  EXPECT_EQ(run_ltrain_within(20, "launch -n 1 --master-port 0 -- train --config x.json", log), 2);
  EXPECT_EQ(run_ltrain_within(20, "launch -n 100000 -- train --config x.json", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain launch: -n 100000: expected 1 to 256 processes"));
  // Several machines: each launcher needs the same address and port of machine 0, and its own number.
  EXPECT_EQ(run_ltrain_within(20, "launch -n 1 --nnodes 2 --node-rank 1 -- train --config x.json", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain launch --nnodes 2: give every node the same --master-addr (the address of "
                                 "node 0's machine) and --master-port (a free TCP port there)"));
  EXPECT_EQ(run_ltrain_within(20, "launch -n 1 --nnodes 2 --node-rank 2 --master-addr 127.0.0.1 --master-port 29500 -- "
                                  "train --config x.json",
                              log),
            2);
  EXPECT_TRUE(one_line_with(log, "ltrain launch: --node-rank 2 must be in 0..1 (--nnodes 2)"));
  EXPECT_EQ(run_ltrain_within(20, "launch -n 1 --nnodes 0 -- train --config x.json", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain launch: --nnodes 0: expected 1 to 4096 machines"));
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
  const NamedTensors tensors = io::read_safetensors(weights, &metadata);
  EXPECT_EQ(tensors.front().first, "conv1.weight");
  EXPECT_EQ(tensors.back().first, "fc.bias");
  EXPECT_EQ(metadata.at("model.arch"), "resnet18");
  EXPECT_EQ(metadata.at("format"), "pt");
}

TEST(Cli, Cifar100RunTrainsEvaluatesAndExportsWithItsClasses) {
  TempDir dir;
  const auto data = dir.path() / "cifar-100-binary";
  testing::write_cifar100_files(data, 200, 100);
  write_file(dir.path() / "c.json", R"({
    "run": {"out_dir": ")" + (dir.path() / "runs").string() + R"(", "name": "c100", "epochs": 1, "device": "cpu"},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4},
    "data": {"source": "cifar100", "root": ")" + data.string() + R"(", "batch_size": 100}})");
  const std::string train = "train --config " + (dir.path() / "c.json").string();
  const auto log = dir.path() / "out";

  // An explicit model.num_classes below the data's classes stops the start, in one line.
  EXPECT_EQ(run_ltrain(train + " model.num_classes=50", log), 2);
  EXPECT_TRUE(one_line_with(log, "--set model.num_classes=50: model.num_classes = 50: the data has 100 classes (labels "
                                 "0 to 99); use at least 100"));
  EXPECT_EQ(run_ltrain(train + " data.cifar100_labels=coarse model.num_classes=10", log), 2);
  EXPECT_TRUE(one_line_with(log, "model.num_classes = 10: the data has 20 classes (labels 0 to 19); use at least 20"));
  // A fine label byte of 100: a data error naming the file and the record.
  const auto damaged = dir.path() / "damaged";
  testing::write_cifar100_files(damaged, 200, 100);
  write_file(damaged / "test.bin", testing::cifar100_record(0, 1, 5) + testing::cifar100_record(1, 1, 100));
  EXPECT_EQ(run_ltrain(train + " data.root=" + damaged.string(), log), 3);
  EXPECT_NE(read_file(log).find((damaged / "test.bin").string() + ": record 1 (byte offset 3074) has fine label 100 "
                                "(expected 0-99): not a CIFAR-100 binary file; fetch it again with "
                                "scripts/get-cifar100.sh\n"),
            std::string::npos)
      << read_file(log);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));

  // Without model.num_classes the run has CIFAR-100's 100 outputs; its summary names the data.
  ASSERT_EQ(run_ltrain(train, dir.path() / "train.out"), 0) << read_file(dir.path() / "train.out");
  const auto run_dir = dir.path() / "runs" / "c100";
  const auto summary = nlohmann::json::parse(read_file(run_dir / "summary.json"));
  EXPECT_EQ(summary["data"],
            nlohmann::json::parse(R"({"source": "cifar100", "classes": 100, "cifar100_labels": "fine"})"));
  EXPECT_EQ(summary["steps"], 2);
  const auto saved = nlohmann::json::parse(read_file(run_dir / "config.json"));
  EXPECT_EQ(saved["model"]["num_classes"], 100);
  EXPECT_EQ(saved["data"]["mean"], nlohmann::json::parse("[0.5071, 0.4865, 0.4409]"));
  EXPECT_EQ(saved["data"]["std"], nlohmann::json::parse("[0.2673, 0.2564, 0.2762]"));

  const auto checkpoint = run_dir / "checkpoints" / "step-00000002.ltc";
  ASSERT_EQ(run_ltrain("eval --json --checkpoint " + checkpoint.string(), dir.path() / "eval.out"), 0)
      << read_file(dir.path() / "eval.out");
  const std::string eval_out = read_file(dir.path() / "eval.out");
  const auto result = nlohmann::json::parse(eval_out.substr(eval_out.find('{')));
  EXPECT_EQ(result["data"], summary["data"]);
  EXPECT_EQ(result["images"], 100);
  ASSERT_EQ(run_ltrain("eval --checkpoint " + checkpoint.string(), dir.path() / "eval.out"), 0);
  EXPECT_NE(read_file(dir.path() / "eval.out").find(") on cifar100 (100 classes), loss "), std::string::npos)
      << read_file(dir.path() / "eval.out");

  // The export carries the data set, so that a reader evaluates it on CIFAR-100's test.bin and fine labels.
  const auto weights = dir.path() / "w.safetensors";
  ASSERT_EQ(run_ltrain("export --checkpoint " + checkpoint.string() + " --out " + weights.string(), log), 0)
      << read_file(log);
  std::map<std::string, std::string> metadata;
  const NamedTensors tensors = io::read_safetensors(weights, &metadata);
  EXPECT_EQ(tensors.back().first, "fc.bias");
  EXPECT_EQ(tensors.back().second.sizes(), torch::IntArrayRef({100}));
  EXPECT_EQ(metadata.at("data.source"), "cifar100");
  EXPECT_EQ(metadata.at("data.cifar100_labels"), "fine");
  EXPECT_EQ(metadata.at("model.num_classes"), "100");
  EXPECT_EQ(metadata.at("data.mean"), "[0.5071,0.4865,0.4409]");
  const auto python = testing::python_with_module("numpy");
  if (!python) GTEST_SKIP() << "no python3 with numpy: export_accuracy.py's reading not checked";
  const auto read = dir.path() / "read.out";
  ASSERT_EQ(std::system((*python + " " LTRAIN_SOURCE_DIR "/scripts/pytorch/export_accuracy.py --dry-run " +
                         weights.string() + " --data " + data.string() + " > " + read.string() + " 2>&1")
                            .c_str()),
            0)
      << read_file(read);
  const auto reading = nlohmann::json::parse(read_file(read));
  EXPECT_EQ(reading["source"], "cifar100");
  EXPECT_EQ(reading["labels"], "fine");
  EXPECT_EQ(reading["file"], (data / "test.bin").string());
  EXPECT_EQ(reading["images"], 100);
  std::vector<int> first_labels;
  for (int record = 200; record < 208; ++record) first_labels.push_back(testing::cifar100_fine_label(record));
  EXPECT_EQ(reading["first_labels"], nlohmann::json(first_labels));
}

TEST(Cli, BenchStepReportsTimesAndSettings) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({
    "run": {"device": "cpu"},
    "model": {"arch": "resnet18", "width": 4, "checkpoint_segments": 2},
    "data": {"source": "synthetic", "synthetic_train_size": 64, "synthetic_test_size": 10, "batch_size": 16}})");
  const std::string bench = "bench step --json --warmup 1 --steps 3 --config " + (dir.path() / "c.json").string();
  const auto started = std::chrono::steady_clock::now();
  ASSERT_EQ(run_ltrain(bench, dir.path() / "out"), 0) << read_file(dir.path() / "out");
  const double process_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string out = read_file(dir.path() / "out");
  const auto result = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(result["arch"], "resnet18");
  EXPECT_EQ(result["batch_size"], 16);
  EXPECT_EQ(result["steps"], 3);
  EXPECT_EQ(result["checkpoint_segments"], 2);
  // The timed seconds are the 3 steps' (not the warm-up's too), in seconds: within the process's
  // lifetime as this test's clock saw it, and the rates follow from them and what was asked for
  // (16 images a step, 3 steps).
  const double seconds = result["seconds"].get<double>();
  EXPECT_GT(seconds, 0.0);
  EXPECT_LT(seconds, process_seconds);
  EXPECT_NEAR(result["images_per_second"].get<double>(), 16 * 3 / seconds, 1e-9 * 16 * 3 / seconds);
  EXPECT_NEAR(result["ms_per_step"].get<double>(), 1000 * seconds / 3, 1e-9 * 1000 * seconds / 3);
  // On the CPU each operator has run when its call returns, so the final sync finds nothing left
  // to wait for: issuing the steps is nearly all of their time (on a GPU it can be far less).
  EXPECT_GT(result["host_ms_per_step"].get<double>(), 0.5 * result["ms_per_step"].get<double>());
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
