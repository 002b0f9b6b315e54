// The ltrain executable as a user meets it: help texts, exit codes, one-line errors; and the
// library's dispatcher, called as main calls it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/wait.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "ltrain/cli/dispatch.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
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
  } else if (shell == "fish") {
    // complete -C: the candidates, each "word<TAB>description"; their words on one line.
    write_file(driver, "source '" + script.string() + "'\n"
                       "echo (complete -C '" + line + "' | string replace -r '\\t.*' '')\n");
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

/// `words` (separated by spaces) sorted, separated by one space.
std::string sorted_words(const std::string& words) {
  std::istringstream split(words);
  std::vector<std::string> list;
  for (std::string word; split >> word;) list.push_back(word);
  std::sort(list.begin(), list.end());
  return fmt::format("{}", fmt::join(list, " "));
}

TEST(Cli, CompletionScriptsOfferCommandsOptionsKeysAndValues) {
  TempDir dir;
  const auto script = dir.path() / "ltrain.bash";
  ASSERT_EQ(run_ltrain("completion bash", script), 0) << read_file(script);
  const std::string bash = read_file(script);
  EXPECT_NE(bash.find("\n_ltrain() {\n"), std::string::npos);
  EXPECT_NE(bash.find("\ncomplete -F _ltrain ltrain\n"), std::string::npos);
  EXPECT_NE(bash.find("_ltrain_commands='train lr-find eval export bench doctor sweep reproduce launch config completion'"),
            std::string::npos);
  const auto keys_at = bash.find("\n_ltrain_keys='");
  ASSERT_NE(keys_at, std::string::npos);
  const std::string keys = " " + bash.substr(keys_at + 15, bash.find('\'', keys_at + 15) - keys_at - 15) + " ";
  for (const config::KeyInfo& key : config::config_keys().keys)
    EXPECT_NE(keys.find(" " + key.name + " "), std::string::npos) << key.name;
  // What bash offers, read from the options --help lists and the config keys.
  EXPECT_EQ(completed(script, "bash", "ltrain ", dir),
            "train lr-find eval export bench doctor sweep reproduce launch config completion --help --version");
  EXPECT_EQ(completed(script, "bash", "ltrain train --d", dir), "--dry-run");
  EXPECT_EQ(completed(script, "bash", "ltrain train --set optim.l", dir), "optim.lr=");
  EXPECT_EQ(completed(script, "bash", "ltrain train --config c.json precision.mo", dir), "precision.mode=");
  EXPECT_EQ(completed(script, "bash", "ltrain train precision.mode=b", dir), "bf16");
  EXPECT_EQ(completed(script, "bash", "ltrain eval --set model.channels_last=", dir), "true false");
  EXPECT_EQ(completed(script, "bash", "ltrain bench ", dir), "step matmul --help");
  EXPECT_EQ(completed(script, "bash", "ltrain bench step --st", dir), "--steps");
  EXPECT_EQ(completed(script, "bash", "ltrain bench step --steps ", dir), "");
  EXPECT_EQ(completed(script, "bash", "ltrain completion ", dir), "bash zsh fish");
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
    EXPECT_EQ(completed(zsh_script, "zsh", "ltrain completion ", dir), "bash zsh fish");
    EXPECT_EQ(completed(zsh_script, "zsh", "ltrain train --config ", dir), "files");
    const std::string options = completed(zsh_script, "zsh", "ltrain train --", dir);
    EXPECT_NE(options.find("--dry-run:check the config"), std::string::npos) << options;
  }

  const auto fish_script = dir.path() / "ltrain.fish";
  ASSERT_EQ(run_ltrain("completion fish", fish_script), 0) << read_file(fish_script);
  const std::string fish = read_file(fish_script);
  const auto fish_keys_at = fish.find("\nset -g __ltrain_keys ");
  ASSERT_NE(fish_keys_at, std::string::npos);
  const std::string fish_keys = fish.substr(fish_keys_at, fish.find('\n', fish_keys_at + 1) - fish_keys_at) + " ";
  for (const config::KeyInfo& key : config::config_keys().keys)
    EXPECT_NE(fish_keys.find(" " + key.name + " "), std::string::npos) << key.name;
  EXPECT_NE(fish.find("complete -c ltrain -n '__ltrain_command_is bench step' -l steps -x -d "), std::string::npos);
  if (std::system("command -v fish > /dev/null 2>&1") == 0) {
    EXPECT_EQ(std::system(("fish -n " + fish_script.string()).c_str()), 0);
    // fish sorts what it offers.
    EXPECT_EQ(sorted_words(completed(fish_script, "fish", "ltrain ", dir)),
              "bench completion config doctor eval export launch lr-find reproduce sweep train");
    EXPECT_EQ(completed(fish_script, "fish", "ltrain train --d", dir), "--dry-run");
    EXPECT_EQ(completed(fish_script, "fish", "ltrain train --set optim.l", dir), "optim.lr=");
    EXPECT_EQ(completed(fish_script, "fish", "ltrain train precision.mode=b", dir), "precision.mode=bf16");
    EXPECT_EQ(sorted_words(completed(fish_script, "fish", "ltrain bench ", dir)), "matmul step");
    EXPECT_EQ(completed(fish_script, "fish", "ltrain bench step --st", dir), "--steps");
    EXPECT_EQ(sorted_words(completed(fish_script, "fish", "ltrain completion ", dir)), "bash fish zsh");
    EXPECT_EQ(completed(fish_script, "fish", "ltrain launch -n 2 -- sweep bench.st", dir), "bench.steps=");
    EXPECT_EQ(completed(fish_script, "fish", "ltrain export optim.l", dir), "");
  }

  EXPECT_EQ(run_ltrain("completion tcsh", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "ltrain completion tcsh: no script for this shell; use bash, zsh or "
                                                "fish"));
  EXPECT_EQ(run_ltrain("completion", dir.path() / "out"), 2);
  EXPECT_TRUE(one_line_with(dir.path() / "out", "ltrain completion needs the shell: ltrain completion bash, zsh or "
                                                "fish"));
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

/// cli::dispatch on the words after "ltrain", as main calls it; its exit code.
int dispatched(std::vector<std::string> words) {
  words.insert(words.begin(), "ltrain");
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  return cli::dispatch(static_cast<int>(argv.size()), argv.data());
}

/// The message of the ConfigError that cli::dispatch throws for `words`; "" when it throws none.
std::string config_error_of(const std::vector<std::string>& words) {
  try {
    dispatched(words);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(Dispatch, UnknownCommandsAreConfigErrorsThatSayWhatThereIs) {
  EXPECT_EQ(config_error_of({"fly"}), "unknown command \"fly\"; run ltrain --help for the list");
  EXPECT_EQ(config_error_of({"bench"}), "ltrain bench needs one of: step, matmul; see ltrain bench --help");
  EXPECT_EQ(config_error_of({"bench", "fly"}),
            "unknown command \"ltrain bench fly\"; use one of: step, matmul (see ltrain bench --help)");
  // The first word of commands of two words is no command of its own.
  EXPECT_EQ(config_error_of({"bench", "bench"}),
            "unknown command \"ltrain bench bench\"; use one of: step, matmul (see ltrain bench --help)");
}

TEST(Dispatch, HelpListsTheCommandTableAndNoCommandIsAUsageError) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(dispatched({"--help"}), 0);
  const std::string help = ::testing::internal::GetCapturedStdout();
  for (const char* command : {"train", "eval", "export", "bench step", "bench matmul", "doctor", "sweep", "reproduce",
                              "launch", "config", "completion"})
    EXPECT_NE(help.find(fmt::format("\n  {:<13} ", command)), std::string::npos) << command << " in " << help;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(dispatched({}), 2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), help);
  // A group's --help: its commands' lines of the list, no more.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(dispatched({"bench", "--help"}), 0);
  const std::string bench = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(std::count(bench.begin(), bench.end(), '\n'), 2) << bench;
  EXPECT_NE(help.find(bench), std::string::npos) << bench;
}

TEST(Dispatch, LaunchTakesItsOptionsBeforeTheDashesAndTheCommandAfterThem) {
  EXPECT_EQ(config_error_of({"launch", "--", "train"}), "ltrain launch: -n N (the number of processes) is required");
  EXPECT_EQ(config_error_of({"launch", "-n", "two", "--", "train"}), "ltrain launch: -n expects a number, got \"two\"");
  EXPECT_EQ(config_error_of({"launch", "--nproc-per-node", "2x", "--", "train"}),
            "ltrain launch: -n expects a number, got \"2x\"");
  EXPECT_EQ(config_error_of({"launch", "-n", "1", "--master-port", "http", "--", "train"}),
            "ltrain launch: --master-port expects a number, got \"http\"");
  // A word before the dashes is no command of the processes.
  EXPECT_EQ(config_error_of({"launch", "-n", "2", "train"}), "unexpected argument \"train\"; see ltrain launch --help");
  // Options after the dashes are the command's, even with the launcher's names: here --nnodes 2
  // would have asked for the master's address instead. (Each case fails before a process starts.)
  EXPECT_EQ(config_error_of({"launch", "-n", "1", "--node-rank", "1", "--", "train", "--nnodes", "2"}),
            "ltrain launch: --node-rank 1 must be in 0..0 (--nnodes 1)");
  EXPECT_EQ(config_error_of({"launch", "-n", "1", "--nnodes", "0", "--", "train", "--", "--nnodes", "3"}),
            "ltrain launch: --nnodes 0: expected 1 to 4096 machines");
}

TEST(Dispatch, BadOptionsAndArgumentsAreConfigErrors) {
  // cxxopts' own errors, a ConfigError too (exit code 2), point at the command's --help.
  EXPECT_EQ(config_error_of({"train", "--bogus"}), "ltrain train: unknown option \"--bogus\"; see ltrain train --help");
  const std::string missing = config_error_of({"bench", "step", "--steps"});
  EXPECT_NE(missing.find("steps"), std::string::npos) << missing;
  EXPECT_EQ(missing.substr(0, 19), "ltrain bench step: ") << missing;
  EXPECT_EQ(missing.substr(missing.size() - 30), "; see ltrain bench step --help") << missing;
  EXPECT_EQ(config_error_of({"train"}), "ltrain train needs --config; see ltrain train --help");
  // A value cxxopts cannot read names the option it was given to, in either form.
  const std::string kind = ": not a value of the option's kind (a number in its range, or true or false for a "
                           "switch); see ltrain bench step --help";
  EXPECT_EQ(config_error_of({"bench", "step", "--warmup", "9", "--steps", "99999999999999999999"}),
            "ltrain bench step: --steps \"99999999999999999999\"" + kind);
  EXPECT_EQ(config_error_of({"bench", "step", "--warmup=ten"}), "ltrain bench step: --warmup \"ten\"" + kind);
  EXPECT_EQ(config_error_of({"export", "--checkpoint", "a.ltc", "stray"}),
            "unexpected argument \"stray\"; see ltrain export --help");
  EXPECT_EQ(config_error_of({"completion", "tcsh"}),
            "ltrain completion tcsh: no script for this shell; use bash, zsh or fish");
}

TEST(Dispatch, MistypedCommandsOptionsAndKeysGetTheClosestOne) {
  EXPECT_EQ(config_error_of({"trian"}), "unknown command \"trian\": did you mean \"train\"? (ltrain --help lists the "
                                        "commands)");
  EXPECT_EQ(config_error_of({"bech"}), "unknown command \"bech\": did you mean \"bench\"? (ltrain --help lists the "
                                       "commands)");
  // An option named after a config key: the override it stands for, its value included.
  EXPECT_EQ(config_error_of({"train", "--config", "c.json", "--lr", "0.1"}),
            "ltrain train: unknown option \"--lr\": did you mean --set optim.lr=0.1? (see ltrain train --help)");
  EXPECT_EQ(config_error_of({"train", "--config", "c.json", "--batch-size=64"}),
            "ltrain train: unknown option \"--batch-size\": did you mean --set data.batch_size=64? (see ltrain train "
            "--help)");
  EXPECT_EQ(config_error_of({"bench", "step", "--optim.lr", "0.2"}),
            "ltrain bench step: unknown option \"--optim.lr\": did you mean --set optim.lr=0.2? (see ltrain bench step "
            "--help)");
  EXPECT_EQ(config_error_of({"train", "--confg", "c.json"}),
            "ltrain train: unknown option \"--confg\": did you mean --config? (see ltrain train --help)");
  // "name" ends several keys (run.name, optim.name, ...): no guess.
  EXPECT_EQ(config_error_of({"train", "--config", "c.json", "--name", "x"}),
            "ltrain train: unknown option \"--name\"; see ltrain train --help");
  EXPECT_EQ(config_error_of({"doctor", "-x"}), "ltrain doctor: unknown option \"-x\"; see ltrain doctor --help");
}

TEST(Dispatch, LaunchAndEveryCommandTakeDashHForHelp) {
  for (const std::vector<std::string>& words :
       std::vector<std::vector<std::string>>{{"launch", "-h"}, {"launch", "-h", "--", "train", "--bogus"},
                                             {"train", "-h"}, {"bench", "step", "-h"}}) {
    ::testing::internal::CaptureStdout();
    EXPECT_EQ(dispatched(words), 0) << words.front();
    const std::string help = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(help.find("Usage:\n  ltrain " + words.front()), std::string::npos) << help;
  }
}

TEST(Dispatch, SeveralConfigFilesMergeInOrder) {
  TempDir dir;
  write_file(dir.path() / "base.json", R"({"optim": {"lr": 0.2, "momentum": 0.8}, "data": {"batch_size": 8}})");
  write_file(dir.path() / "lr.json", R"({"optim": {"lr": 0.3}})");
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(dispatched({"train", "--print-config", "--config", (dir.path() / "base.json").string(), "--config",
                        (dir.path() / "lr.json").string(), "optim.momentum=0.7"}),
            0);
  const auto printed = nlohmann::json::parse(::testing::internal::GetCapturedStdout());
  EXPECT_EQ(printed["optim"]["lr"], 0.3);          // the later file's
  EXPECT_EQ(printed["data"]["batch_size"], 8);     // the earlier file's, which the later leaves alone
  EXPECT_EQ(printed["optim"]["momentum"], 0.7);    // overrides after every file
}

TEST(Dispatch, ExportRefusesToReplaceAFileWithoutForce) {
  TempDir dir;
  const auto out = dir.path() / "weights.safetensors";
  write_file(out, "keep me");
  const std::vector<std::string> words{"export", "--checkpoint", (dir.path() / "none.ltc").string(), "--out",
                                       out.string()};
  try {
    dispatched(words);
    ADD_FAILURE() << "no error";
  } catch (const UserError& error) {
    EXPECT_EQ(error.code(), ExitCode::output_exists);
    EXPECT_EQ(static_cast<int>(error.code()), 6);
    EXPECT_EQ(std::string(error.what()), "ltrain export --out " + out.string() +
                                             ": the file exists; add --force to replace it, or give another --out");
  }
  EXPECT_EQ(read_file(out), "keep me");
  // The exit code with one more word: --force=false is no --force; with --force it goes on to the
  // checkpoint (missing here: a data error).
  const auto code_with = [&](const std::string& word) {
    std::vector<std::string> more = words;
    more.push_back(word);
    try {
      dispatched(more);
    } catch (const UserError& error) {
      return error.code();
    }
    return ExitCode::ok;
  };
  EXPECT_EQ(code_with("--force=false"), ExitCode::output_exists);
  EXPECT_EQ(code_with("--force"), ExitCode::data);
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
  EXPECT_TRUE(one_line_with(log, "ltrain train: argument \"optim.lrr=0.1\": \"optim.lrr\" is not a config key: did you "
                                 "mean \"optim.lr\"?"));
  EXPECT_EQ(run_ltrain(print + " zzz.qqq=0.1", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain train: argument \"zzz.qqq=0.1\": \"zzz.qqq\" is not a config key; ltrain "
                                 "train --help lists them"));
  EXPECT_EQ(run_ltrain(print + " --set optim.lrr=0.1", log), 2);
  EXPECT_TRUE(one_line_with(log, "--set optim.lrr=0.1: unknown key \"optim.lrr\": did you mean \"optim.lr\"?"));
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

TEST(Cli, TrainJsonLogsOneObjectPerLineWithStepLossAndLr) {
  TempDir dir;
  const auto log = dir.path() / "out";
  ASSERT_EQ(run_ltrain("train --json --config " + tiny_config(dir) + " run.max_steps=3 run.log_every_steps=1", log), 0)
      << read_file(log);
  std::istringstream lines(read_file(log));
  int progress = 0;
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json object;
    ASSERT_NO_THROW(object = nlohmann::json::parse(line)) << line;
    EXPECT_TRUE(object["time"].is_string() && object["level"].is_string() && object["message"].is_string()) << line;
    if (object["message"].get<std::string>().rfind("checkpoint ", 0) == 0) {
      EXPECT_FALSE(object.contains("event")) << line;
    }
    if (object.value("event", "") != "progress") continue;
    ++progress;
    EXPECT_EQ(object["step"], progress) << line;
    EXPECT_TRUE(object["loss"].is_number() && object["lr"].is_number() && object["epoch"].is_number()) << line;
  }
  EXPECT_EQ(progress, 3);
}

TEST(Cli, NoColorTurnsTheLogsColoursOff) {
  // On a terminal that takes colours the level is coloured; NO_COLOR (any value but "") turns that off.
  const char* term = std::getenv("TERM");
  const std::string saved_term = term ? term : "";
  const auto first_line = [&saved_term](bool no_color) {
    ::setenv("TERM", "xterm", 1);
    if (no_color) ::setenv("NO_COLOR", "1", 1);
    testing::LtrainProcess ltrain({"trian"}, testing::LtrainProcess::Output::terminal);
    ::unsetenv("NO_COLOR");
    if (saved_term.empty()) ::unsetenv("TERM");
    else ::setenv("TERM", saved_term.c_str(), 1);
    EXPECT_EQ(ltrain.wait(30), 2);
    return ltrain.output();
  };
  const std::string coloured = first_line(false), plain = first_line(true);
  EXPECT_NE(coloured.find("\033["), std::string::npos) << coloured;
  EXPECT_EQ(plain.find("\033"), std::string::npos) << plain;
  EXPECT_NE(plain.find("error unknown command \"trian\": did you mean \"train\"?"), std::string::npos) << plain;
}

TEST(Cli, LrFindPrintsLossAgainstLrAndWritesItAsCsv) {
  TempDir dir;
  const auto log = dir.path() / "out";
  const auto csv = dir.path() / "lr.csv";
  ASSERT_EQ(run_ltrain("lr-find --config " + tiny_config(dir) + " --steps 5 --start-lr 1e-4 --end-lr 1 --out " +
                           csv.string(),
                       log),
            0)
      << read_file(log);
  const std::string out = read_file(log);
  EXPECT_NE(out.find("\n    1      0.0001  "), std::string::npos) << out;
  EXPECT_NE(out.find("\nsuggested lr: "), std::string::npos) << out;
  const std::string rows = read_file(csv);
  EXPECT_EQ(rows.substr(0, 28), "step,lr,loss,smoothed_loss\n1") << rows;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));  // writes no run
  EXPECT_EQ(run_ltrain("lr-find --config " + tiny_config(dir) + " --steps 2", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain lr-find --steps 2: expected 3 or more"));
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
  // A synthetic set larger than this machine's memory (4M images of 224x224: 632 GB, 1.3 TB with
  // the training loader's copy for augmentation) is refused before it is made, not ended by the OOM killer.
  EXPECT_EQ(run_ltrain("train --dry-run --config " + config + " data.synthetic_train_size=4194304 data.image_size=224",
                       log),
            2);
  EXPECT_TRUE(one_line_with(log, "data.synthetic_train_size = 4194304, data.synthetic_test_size = 8: the synthetic "
                                 "224x224 images need "));
  EXPECT_NE(read_file(log).find(" GB this machine has available; use fewer images"), std::string::npos)
      << read_file(log);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
}

// channels_last on the CPU trains a model as narrow as LibTorch's convolutions allow there, and a
// narrower one is refused before anything runs.
TEST(Cli, ChannelsLastOnTheCpuTrainsOnlyModelsItsConvolutionsCanRun) {
  TempDir dir;
  const std::string config = tiny_config(dir);
  const auto log = dir.path() / "out";
  const int64_t least = ltrain::compat::min_cpu_channels_last_channels();
  ASSERT_GT(least, 4);
  EXPECT_EQ(run_ltrain("train --config " + config + " model.channels_last=true model.width=" + std::to_string(least),
                       log),
            0)
      << read_file(log);
  testing::remove_tree(dir.path() / "runs");
  EXPECT_EQ(run_ltrain("train --config " + config + " model.channels_last=true", log), 2);
  EXPECT_TRUE(one_line_with(log, "model.channels_last = true: channels_last on the CPU needs model.width " +
                                     std::to_string(least) + " or more"));
  EXPECT_NE(read_file(log).find("model.width is 4: set model.channels_last to false or widen the model"),
            std::string::npos)
      << read_file(log);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
}

// Every setting the device cannot run is refused in one run, by --dry-run as by a run, with the
// same exit code; the guides' recipes on the CPU among them.
TEST(Cli, DryRunRefusesEverySettingTheDeviceCannotRunAtOnce) {
  TempDir dir;
  const std::string config = tiny_config(dir);
  const auto log = dir.path() / "out";
  const std::string settings = " precision.mode=fp16 precision.tf32=true cuda_graph.train=true cuda_graph.eval=true";
  for (const std::string command : {"train --dry-run --config ", "train --config "}) {
    EXPECT_EQ(run_ltrain(command + config + settings, log), 2) << command;
    const std::string out = read_file(log);
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
    for (const char* line :
         {"--set precision.mode=fp16: precision.mode = \"fp16\": fp16 autocast needs a CUDA device",
          "--set precision.tf32=true: precision.tf32 = true: TF32 is a feature of NVIDIA GPUs",
          "--set cuda_graph.train=true: cuda_graph.train = true: CUDA graphs need a CUDA device",
          "--set cuda_graph.eval=true: cuda_graph.eval = true: CUDA graphs need a CUDA device"})
      EXPECT_NE(out.find(line), std::string::npos) << line << " not in: " << out;
  }
  // With values out of their limits: those too, every one, in the same run.
  for (const std::string command : {"train --dry-run --config ", "train --config "}) {
    EXPECT_EQ(run_ltrain(command + config + " optim.lr=-1 data.cutout=100" + settings, log), 2) << command;
    const std::string out = read_file(log);
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 6) << out;
    for (const char* line : {"--set data.cutout=100: data.cutout = 100: expected ",
                             "--set optim.lr=-1: optim.lr = -1: expected a number > 0",
                             "fp16 autocast needs a CUDA device", "TF32 is a feature of NVIDIA GPUs",
                             "cuda_graph.train = true: CUDA graphs need a CUDA device",
                             "cuda_graph.eval = true: CUDA graphs need a CUDA device"})
      EXPECT_NE(out.find(line), std::string::npos) << line << " not in: " << out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
  const auto articles = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs" / "articles";
  for (const char* name : {"4090-guide.json", "4090d-guide.json", "5090-guide.json"}) {
    EXPECT_EQ(run_ltrain("train --dry-run --config " + (articles / name).string() + " run.device=cpu", log), 2) << name;
    const std::string out = read_file(log);
    EXPECT_NE(out.find("precision.mode = \"fp16\": fp16 autocast needs a CUDA device"), std::string::npos) << out;
    EXPECT_NE(out.find("cuda_graph.train = true: CUDA graphs need a CUDA device"), std::string::npos) << out;
  }
}

// A shipped recipe shortened by run.epochs alone passes the config's checks: what is left is what
// the CPU cannot run, all of it in one run.
TEST(Cli, ARecipeShortenedByRunEpochsAloneNeedsNothingElse) {
  TempDir dir;
  const auto log = dir.path() / "out";
  const std::string recipe = LTRAIN_SOURCE_DIR "/configs/accuracy/resnet50-cifar.json";
  EXPECT_EQ(run_ltrain("train --print-config --config " + recipe + " run.epochs=3", log), 0) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_EQ(nlohmann::json::parse(out.substr(out.find('{')))["data"]["progressive_epochs"], 2) << out;
  EXPECT_NE(out.find("data.progressive_epochs 24 of 40 epochs follows --set run.epochs=3: 2 of 3"), std::string::npos)
      << out;
  EXPECT_EQ(run_ltrain("train --dry-run --config " + recipe + " run.epochs=3 run.device=cpu", log), 2);
  const std::string refused = read_file(log);
  EXPECT_NE(refused.find("cuda_graph.train = true"), std::string::npos) << refused;
  EXPECT_NE(refused.find("cuda_graph.eval = true"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("data.progressive_epochs = "), std::string::npos) << refused;  // no error about it
}

// Input that used to fail late, or under another name, fails at start with one line naming it.
TEST(Cli, BadInputsGetOneLineAndTheirExitCode) {
  TempDir dir;
  const std::string config = tiny_config(dir);
  const auto log = dir.path() / "out";
  EXPECT_EQ(run_ltrain("train --config " + config + " --set run.out_dir=", log), 2);
  EXPECT_TRUE(one_line_with(log, "--set run.out_dir=: run.out_dir = \"\": expected the folder that holds the run"));
  EXPECT_EQ(run_ltrain("train --config " + config + " --set 'run.name= '", log), 2);
  EXPECT_TRUE(one_line_with(log, "run.name = \" \": expected a folder name"));
  EXPECT_EQ(run_ltrain("train --config " + config + " --set 'data.std=[5e-324,5e-324,5e-324]'", log), 2);
  EXPECT_TRUE(one_line_with(log, "data.std = [5e-324,5e-324,5e-324]: expected a list of numbers >= 0.001"));
  EXPECT_EQ(run_ltrain("train --config " + config + " --set schedule.min_lr=0.5", log), 2);
  EXPECT_TRUE(one_line_with(log, "schedule.min_lr = 0.5: expected at most optim.lr (0.1)"));
  EXPECT_EQ(run_ltrain("train --dry-run --config " + config + " --set model.init_from=/proc/self/mem", log), 2);
  EXPECT_TRUE(one_line_with(log, "model.init_from = \"/proc/self/mem\": cannot be read (Input/output error)"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
  // A results folder where a file is.
  write_file(dir.path() / "a-file", "");
  EXPECT_EQ(run_ltrain("reproduce --config " + config + " --out " + (dir.path() / "a-file").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, "--out " + (dir.path() / "a-file").string() +
                                     ": cannot create this results folder (Not a directory); choose another --out"));
}

// data.root left at its default is found from another working directory in the ltrain folder the
// build came from; where that lacks it too, the error names both places.
TEST(Cli, TheDefaultDataRootIsLookedForBesideLtrainToo) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({"run": {"device": "cpu", "epochs": 1},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4}})");
  const std::string command = "cd '" + dir.path().string() + "' && " LTRAIN_EXECUTABLE
                              " train --dry-run --config c.json > out 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  const std::string out = read_file(dir.path() / "out");
  const std::filesystem::path beside = std::filesystem::path(LTRAIN_SOURCE_DIR) / "data" / "cifar-10-batches-bin";
  if (std::filesystem::exists(beside / "data_batch_1.bin")) {
    EXPECT_EQ(WEXITSTATUS(status), 0) << out;
    EXPECT_NE(out.find("reading " + beside.string()), std::string::npos) << out;
  } else {
    EXPECT_EQ(WEXITSTATUS(status), 3) << out;
    EXPECT_NE(out.find("data/cifar-10-batches-bin/data_batch_1.bin (" +
                       (dir.path() / "data" / "cifar-10-batches-bin" / "data_batch_1.bin").string() + "): no such file"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("was looked for in " + (dir.path() / "data" / "cifar-10-batches-bin").string() + " and " +
                       beside.string()),
              std::string::npos)
        << out;
  }
}

TEST(Cli, CheckpointsAndOutputsThatAreNotRegularFilesAreRefused) {
  TempDir dir;
  const auto log = dir.path() / "out";
  ASSERT_EQ(::mkfifo((dir.path() / "pipe").c_str(), 0600), 0);
  const std::string pipe = (dir.path() / "pipe").string();
  const std::string hint = "; give the path of a checkpoint file (RUN/checkpoints/step-N.ltc)";
  for (const std::string command : {"eval --checkpoint ", "export --out x.safetensors --checkpoint "}) {
    // A folder is a run folder, whose checkpoint they take: here there is none.
    EXPECT_EQ(run_ltrain_within(20, command + dir.path().string(), log), 3) << command;
    EXPECT_TRUE(one_line_with(log, dir.path().string() + ": a folder without a checkpoint (" + dir.path().string() +
                                       " holds no best.ltc and no valid step-*.ltc): give a run folder with "
                                       "checkpoints, or a checkpoint file"));
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
  // lr-find's --out too, before the test runs; a file there stays without --force.
  const std::string lr_find = "lr-find --config " + tiny_config(dir) + " --steps 3 --out ";
  EXPECT_EQ(run_ltrain_within(20, lr_find + pipe, log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain lr-find --out " + pipe +
                                     ": is a FIFO (named pipe), not a file; give the path of a new or regular file "
                                     "(.csv)"));
  ASSERT_EQ(::stat(pipe.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  const auto kept = dir.path() / "kept.csv";
  write_file(kept, "keep me");
  EXPECT_EQ(run_ltrain_within(20, lr_find + kept.string(), log), 6);
  EXPECT_TRUE(one_line_with(log, "ltrain lr-find --out " + kept.string() +
                                     ": the file exists; add --force to replace it, or give another --out"));
  EXPECT_EQ(read_file(kept), "keep me");
  EXPECT_EQ(run_ltrain_within(20, lr_find + kept.string() + " --force", log), 0) << read_file(log);
  EXPECT_EQ(read_file(kept).substr(0, 26), "step,lr,loss,smoothed_loss");
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

TEST(Cli, LaunchPassesEverythingAfterTheDashesOnUntouched) {
  TempDir dir;
  const auto log = dir.path() / "out";
  // An option first, and a second "--" (train's: what follows is bare overrides).
  ASSERT_EQ(run_ltrain_within(60, "launch -n 1 -- --version", log), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("ltrain " LTRAIN_VERSION " (commit "), std::string::npos) << read_file(log);
  ASSERT_EQ(run_ltrain_within(60, "launch -n 1 -- train --print-config --config " + tiny_config(dir) +
                                      " --set optim.lr=0.25 -- data.batch_size=4",
                              log),
            0)
      << read_file(log);
  const std::string out = read_file(log);
  const auto printed = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(printed["optim"]["lr"], 0.25);
  EXPECT_EQ(printed["data"]["batch_size"], 4);
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
  // A run folder stands for its newest checkpoint (its best.ltc, where the run keeps one).
  ASSERT_EQ(run_ltrain("eval --json --checkpoint " + (dir.path() / "runs" / "cli").string(), dir.path() / "eval.out"), 0)
      << read_file(dir.path() / "eval.out");
  const std::string run_eval = read_file(dir.path() / "eval.out");
  EXPECT_NE(run_eval.find((dir.path() / "runs" / "cli").string() + ": its newest checkpoint, " + checkpoint.string() +
                          " (--checkpoint FILE takes another)\n"),
            std::string::npos)
      << run_eval;
  EXPECT_EQ(nlohmann::json::parse(run_eval.substr(run_eval.find('{'))), result);

  const auto weights = dir.path() / "w.safetensors";
  ASSERT_EQ(run_ltrain("export --checkpoint " + checkpoint.string() + " --out " + weights.string(), dir.path() / "x.out"),
            0);
  std::map<std::string, std::string> metadata;
  const NamedTensors tensors = io::read_safetensors(weights, &metadata);
  EXPECT_EQ(tensors.front().first, "conv1.weight");
  EXPECT_EQ(tensors.back().first, "fc.bias");
  EXPECT_EQ(metadata.at("model.arch"), "resnet18");
  EXPECT_EQ(metadata.at("format"), "pt");

  // Never over the checkpoint it reads, even with --force.
  const std::string saved = read_file(checkpoint);
  EXPECT_EQ(run_ltrain("export --checkpoint " + checkpoint.string() + " --out " + checkpoint.string() + " --force",
                       dir.path() / "x.out"),
            2);
  EXPECT_TRUE(one_line_with(dir.path() / "x.out", "ltrain export --out " + checkpoint.string() +
                                                      ": that is the checkpoint it reads; give another --out"));
  EXPECT_EQ(read_file(checkpoint), saved);
  // A saved or given run.threads past this machine's is what it can give, not a hang or a crash.
  ASSERT_EQ(run_ltrain_within(60, "eval --checkpoint " + checkpoint.string() + " --set run.threads=2147483648",
                              dir.path() / "eval.out"),
            0)
      << read_file(dir.path() / "eval.out");
  EXPECT_NE(read_file(dir.path() / "eval.out").find("run.threads = 2147483648: this machine has "), std::string::npos);
}

TEST(Cli, OutputThatCannotReachStandardOutputEndsWithExitCodeFour) {
  TempDir dir;
  const auto log = dir.path() / "err";
  const std::vector<std::string> commands{"config --schema", "train --print-config --config " + tiny_config(dir)};
  for (const std::string& command : commands) {
    const std::string shell = std::string(LTRAIN_EXECUTABLE) + " " + command + " > /dev/full 2> '" + log.string() + "'";
    const int status = std::system(shell.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << command;
    EXPECT_EQ(WEXITSTATUS(status), 4) << command;
    // Why is the system's word (errno) where the write that failed was the last; the line stays one.
    EXPECT_TRUE(one_line_with(log, "cannot write to standard output (")) << read_file(log);
    EXPECT_NE(read_file(log).find("): free disk space or send the output elsewhere"), std::string::npos);
  }
}

// `ltrain train --json | head -1`: the reader goes after the first line, and ltrain finds the
// closed pipe at its next write (SIGPIPE does not end it with 141): the run stops as on a signal,
// with a checkpoint, a line on stderr and in train.log, and exit code 4. A full disk under stdout
// is found at the first line, not at the end of the run. The same command with
// checkpoint.resume=auto, its output kept, goes on.
TEST(Cli, AClosedOrFullStandardOutputStopsATrainingRunWithACheckpointAndExitCodeFour) {
  TempDir dir;
  write_file(dir.path() / "c.json", R"({
    "run": {"out_dir": ")" + (dir.path() / "runs").string() + R"(", "name": "run", "epochs": 100,
            "log_every_steps": 1, "device": "cpu"},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4},
    "data": {"source": "synthetic", "synthetic_train_size": 64, "synthetic_test_size": 8, "batch_size": 8}})");
  const std::string config = (dir.path() / "c.json").string();
  const std::filesystem::path script = dir.path() / "pipe.sh";
  write_file(script, "\"$1\" train --json --config \"$2\" 2> \"$3\" | head -1 > \"$4\"\necho \"${PIPESTATUS[0]}\" > \"$5\"\n");
  const auto err = dir.path() / "err", code = dir.path() / "code", first = dir.path() / "first";
  const std::string command = "timeout 300 bash " + script.string() + " " LTRAIN_EXECUTABLE " " + config + " " +
                              err.string() + " " + first.string() + " " + code.string();
  ASSERT_EQ(std::system(command.c_str()), 0);
  EXPECT_EQ(read_file(code), "4\n") << read_file(err);
  EXPECT_NO_THROW(nlohmann::json::parse(read_file(first))) << read_file(first);
  const std::filesystem::path run_dir = dir.path() / "runs" / "run";
  // The newest checkpoint is the one of the stop (the names sort by step).
  std::vector<std::filesystem::path> checkpoints = testing::files_below(run_dir / "checkpoints", ".ltc");
  ASSERT_FALSE(checkpoints.empty()) << read_file(err);
  const std::string stopped = "cannot write to standard output (Broken pipe): the run stopped after step ";
  EXPECT_TRUE(one_line_with(err, stopped)) << read_file(err);
  EXPECT_NE(read_file(err).find("; checkpoint " + checkpoints.back().string() + " written: once the output goes where "
                                "it can be written, the same command with --set checkpoint.resume=auto to continue"),
            std::string::npos)
      << read_file(err);
  const int64_t resumed_from = std::stoll(checkpoints.back().stem().string().substr(5));
  EXPECT_NE(read_file(run_dir / "train.log").find(stopped), std::string::npos) << read_file(run_dir / "train.log");
  EXPECT_FALSE(std::filesystem::exists(run_dir / "summary.json"));

  // A full disk: the first line fails, the run stops after its first step.
  const std::string full = std::string(LTRAIN_EXECUTABLE) + " train --json --config " + config +
                           " checkpoint.resume=auto > /dev/full 2> '" + err.string() + "'";
  const int status = std::system(("timeout 300 " + full).c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4) << read_file(err);
  EXPECT_TRUE(one_line_with(err, "cannot write to standard output (No space left on device): the run stopped after "
                                 "step "))
      << read_file(err);
  checkpoints = testing::files_below(run_dir / "checkpoints", ".ltc");
  EXPECT_EQ(std::stoll(checkpoints.back().stem().string().substr(5)), resumed_from + 1);
  // Kept where it can be written, the run goes on from there.
  ASSERT_EQ(run_ltrain("train --json --config " + config + " checkpoint.resume=auto run.max_steps=" +
                           std::to_string(resumed_from + 3),
                       dir.path() / "out"),
            0)
      << read_file(dir.path() / "out");
  EXPECT_EQ(nlohmann::json::parse(read_file(run_dir / "summary.json"))["steps"], resumed_from + 3);
}

// What Hydra's users type gets a pointer to what ltrain does instead, in one line.
TEST(Cli, HydraHabitsGetAPointerToLtrainsWay) {
  TempDir dir;
  const auto log = dir.path() / "out";
  const std::string config = tiny_config(dir);
  const std::string sweep = "ltrain sweep --base CONFIG --grid optim.lr=0.1,0.2 (see ltrain sweep --help)";
  EXPECT_EQ(run_ltrain("train -m --config " + config + " optim.lr=0.1,0.2", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain train: unknown option \"-m\"; several runs over lists of values are a "
                                 "sweep: " + sweep));
  EXPECT_EQ(run_ltrain("train --config " + config + " optim.lr=0.1,0.2", log), 2);
  EXPECT_TRUE(one_line_with(log, "ltrain train: \"optim.lr=0.1,0.2\": optim.lr takes one value; a run per value of a "
                                 "list is a sweep: ltrain sweep --base CONFIG --grid optim.lr=0.1,0.2"));
  EXPECT_EQ(run_ltrain("train --config " + config + " --set precision.mode=fp32,bf16", log), 2);
  EXPECT_TRUE(one_line_with(log, "precision.mode takes one value; a run per value of a list is a sweep"));
  // Text with commas is a string where a key takes one.
  EXPECT_EQ(run_ltrain("train --print-config --config " + config + " run.name=a,b", log), 0) << read_file(log);
  // A YAML file is named as such, with how to make JSON of it.
  write_file(dir.path() / "c.yaml", "# a Hydra config\noptim:\n  lr: 0.1\n");
  const std::string yaml = (dir.path() / "c.yaml").string();
  EXPECT_EQ(run_ltrain("train --config " + yaml, log), 2);
  EXPECT_TRUE(one_line_with(log, yaml + ": this is YAML (Hydra's format, say), and ltrain reads JSON configs: write "
                                        "it as JSON, e.g. python3 -c"));
  write_file(dir.path() / "c.json", "run:\n  epochs: 2\n");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, ": this is YAML (Hydra's format, say)"));
  write_file(dir.path() / "c.json", "{\"run\": {\"epochs\": 2,}}");
  EXPECT_EQ(run_ltrain("train --config " + (dir.path() / "c.json").string(), log), 2);
  EXPECT_TRUE(one_line_with(log, ": not valid JSON: "));
}

// A trained run's export, read by the safetensors package into torchvision's own model
// (scripts/pytorch/export_accuracy.py: load_state_dict with strict=True), scores the real test
// images as `ltrain eval` scores the checkpoint, to float32's precision: the same weights, BatchNorm
// statistics and normalization on both sides. The run keeps a weight average, which both evaluate.
TEST(Cli, ExportScoresInTorchvisionAsLtrainEvalDoes) {
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  LTRAIN_REQUIRE_PYTHON(python, "torch, torchvision, safetensors");
  TempDir dir;
  write_file(dir.path() / "c.json", R"({
    "run": {"out_dir": ")" + (dir.path() / "runs").string() + R"(", "name": "export", "epochs": 1, "device": "cpu",
            "seed": 3, "max_steps": 12},
    "model": {"arch": "resnet18", "stem": "imagenet"},
    "data": {"root": ")" + root.string() + R"(", "batch_size": 50},
    "optim": {"lr": 0.05, "ema_decay": 0.8}})");
  const std::string train = "train --config " + (dir.path() / "c.json").string();
  ASSERT_EQ(run_ltrain(train, dir.path() / "train.out"), 0) << read_file(dir.path() / "train.out");
  const auto checkpoint = dir.path() / "runs" / "export" / "checkpoints" / "step-00000012.ltc";
  ASSERT_EQ(run_ltrain("eval --json --checkpoint " + checkpoint.string(), dir.path() / "eval.out"), 0)
      << read_file(dir.path() / "eval.out");
  const std::string eval_out = read_file(dir.path() / "eval.out");
  const auto ltrain_result = nlohmann::json::parse(eval_out.substr(eval_out.find('{')));
  const auto weights = dir.path() / "w.safetensors";
  ASSERT_EQ(run_ltrain("export --checkpoint " + checkpoint.string() + " --out " + weights.string(), dir.path() / "x.out"),
            0)
      << read_file(dir.path() / "x.out");

  const auto scored = dir.path() / "torchvision.out";
  const std::string command = python + " " LTRAIN_SOURCE_DIR "/scripts/pytorch/export_accuracy.py --json --device cpu " +
                              weights.string() + " --data " + root.string() + " > " + scored.string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(scored);
  const auto torchvision_result = nlohmann::json::parse(read_file(scored));
  ASSERT_EQ(torchvision_result["images"], 1000);
  ASSERT_EQ(ltrain_result["images"], 1000);
  // The loss tells apart any two models that differ; two libraries' float32 sums differ by far less
  // than 1e-4 of it, and may flip a near tie or two among the predictions.
  const double loss = ltrain_result["loss"].get<double>();
  EXPECT_NEAR(torchvision_result["loss"].get<double>(), loss, 1e-4 * loss) << eval_out << read_file(scored);
  EXPECT_NEAR(torchvision_result["correct"].get<int64_t>(), ltrain_result["correct"].get<int64_t>(), 2)
      << eval_out << read_file(scored);
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
  LTRAIN_REQUIRE_PYTHON(python, "numpy");
  const auto read = dir.path() / "read.out";
  ASSERT_EQ(std::system((python + " " LTRAIN_SOURCE_DIR "/scripts/pytorch/export_accuracy.py --dry-run " +
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
