#include <gtest/gtest.h>

#include "ltrain/bench/sweep.h"
#include "ltrain/config/load.h"
#include "support.h"

namespace ltrain::config {
namespace {

using ltrain::testing::TempDir;
using ltrain::testing::write_file;

/// The message of the ConfigError that loading `text` as FILE.json (with overrides) throws.
std::string error_of(const TempDir& dir, const std::string& text, const std::vector<std::string>& overrides = {}) {
  const auto file = dir.path() / "run.json";
  write_file(file, text);
  try {
    load_file(file, overrides);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(Config, DefaultsWhenEmpty) {
  TempDir dir;
  write_file(dir.path() / "empty.json", "{}");
  const LoadedConfig loaded = load_file(dir.path() / "empty.json");
  EXPECT_EQ(loaded.config.model.arch, Arch::resnet50);
  EXPECT_EQ(loaded.config.data.batch_size, 256);
  EXPECT_DOUBLE_EQ(loaded.config.optim.lr, 0.1);
  EXPECT_TRUE(loaded.origin.empty());
}

TEST(Config, ReadsEveryType) {
  TempDir dir;
  write_file(dir.path() / "x.json", R"({"model": {"arch": "resnet18", "stem": "cifar", "zero_init_residual": true},
    "optim": {"name": "adamw", "lr": 0.001, "betas": [0.8, 0.95]}, "run": {"epochs": 3, "name": "abc"},
    "schedule": {"name": "multistep", "milestones": [1, 2]}})");
  const RunConfig c = load_file(dir.path() / "x.json").config;
  EXPECT_EQ(c.model.arch, Arch::resnet18);
  EXPECT_EQ(c.model.stem, Stem::cifar);
  EXPECT_TRUE(c.model.zero_init_residual);
  EXPECT_EQ(c.optim.name, OptimizerKind::adamw);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.001);
  EXPECT_EQ(c.optim.betas, (std::vector<double>{0.8, 0.95}));
  EXPECT_EQ(c.run.epochs, 3);
  EXPECT_EQ(c.run.name, "abc");
  EXPECT_EQ(c.schedule.milestones, (std::vector<double>{1, 2}));
}

TEST(Config, UnknownKeySuggestsTheClosest) {
  TempDir dir;
  EXPECT_EQ(error_of(dir, R"({"optim": {"lrr": 0.1}})"),
            (dir.path() / "run.json").string() + ": unknown key \"optim.lrr\": did you mean \"optim.lr\"?");
}

TEST(Config, UnknownKeyListsTheKnownOnes) {
  TempDir dir;
  EXPECT_EQ(error_of(dir, R"({"loss": {"focal": 2}})"),
            (dir.path() / "run.json").string() + ": unknown key \"loss.focal\"; the keys of loss are: label_smoothing");
}

TEST(Config, UnknownSection) {
  TempDir dir;
  EXPECT_EQ(error_of(dir, R"({"optimizer": {}})"),
            (dir.path() / "run.json").string() + ": unknown key \"optimizer\": did you mean \"optim\"?");
}

TEST(Config, WrongTypes) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": "fast"}})"), file + ": optim.lr = \"fast\": expected a number > 0");
  EXPECT_EQ(error_of(dir, R"({"run": {"epochs": 2.5}})"), file + ": run.epochs = 2.5: expected an integer >= 1");
  EXPECT_EQ(error_of(dir, R"({"data": {"random_crop": 1}})"), file + ": data.random_crop = 1: expected true or false");
  EXPECT_EQ(error_of(dir, R"({"run": {"name": 7}})"), file + ": run.name = 7: expected a string");
  EXPECT_EQ(error_of(dir, R"({"model": {"arch": "resnet51"}})"),
            file + ": model.arch = \"resnet51\": expected one of resnet18, resnet34, resnet50, resnet101, resnet152");
  EXPECT_EQ(error_of(dir, R"({"data": {"mean": "0.5"}})"),
            file + ": data.mean = \"0.5\": expected a list of numbers between 0 and 1");
  EXPECT_EQ(error_of(dir, R"({"optim": 3})"), file + ": optim = 3: expected an object of optim keys");
}

TEST(Config, OutOfRange) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": -0.1}})"), file + ": optim.lr = -0.1: expected a number > 0");
  EXPECT_EQ(error_of(dir, R"({"data": {"batch_size": 0}})"), file + ": data.batch_size = 0: expected an integer >= 1");
  EXPECT_EQ(error_of(dir, R"({"optim": {"momentum": 1.5}})"),
            file + ": optim.momentum = 1.5: expected a number between 0 and 1");
  EXPECT_EQ(error_of(dir, R"({"data": {"std": [0.2, 0, 0.2]}})"),
            file + ": data.std = [0.2,0,0.2]: expected a list of numbers > 0");
  EXPECT_EQ(error_of(dir, R"({"data": {"cutout": 33}})"),
            file + ": data.cutout = 33: expected an integer between 0 and 32");
  EXPECT_EQ(error_of(dir, R"({"precision": {"cudnn_benchmark_limit": -1}})"),
            file + ": precision.cudnn_benchmark_limit = -1: expected an integer between 0 and 100000");
}

TEST(Config, ImpossibleCombinations) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, R"({"schedule": {"name": "onecycle", "warmup_epochs": 2}})"),
            file + ": schedule.warmup_epochs = 2.0: the onecycle schedule has its own warm-up (schedule.pct_start); "
                   "set schedule.warmup_epochs to 0");
  EXPECT_EQ(error_of(dir, R"({"optim": {"name": "adamw", "nesterov": true}})"),
            file + ": optim.nesterov = true: Nesterov momentum needs optim.name \"sgd\" and optim.momentum > 0");
  EXPECT_EQ(error_of(dir, R"({"schedule": {"name": "multistep"}})"),
            file + ": schedule.milestones = []: the multistep schedule needs at least one milestone epoch");
  EXPECT_EQ(error_of(dir, R"({"schedule": {"milestones": [5, 3]}})"),
            file + ": schedule.milestones = [5.0,3.0]: expected epochs in increasing order");
  EXPECT_EQ(error_of(dir, R"({"run": {"epochs": 2}, "schedule": {"warmup_epochs": 3}})"),
            file + ": schedule.warmup_epochs = 3.0: expected fewer epochs than run.epochs (2)");
  EXPECT_EQ(error_of(dir, R"({"data": {"mean": [0.5, 0.5]}})"),
            file + ": data.mean = [0.5,0.5]: expected a list of 3 numbers (R, G, B)");
  EXPECT_EQ(error_of(dir, R"({"run": {"device": "gpu"}})"),
            file + ": run.device = \"gpu\": expected auto, cpu, cuda or cuda:N");
  EXPECT_EQ(error_of(dir, R"({"run": {"name": "a/b"}})"),
            file + ": run.name = \"a/b\": expected a folder name without '/'");
  EXPECT_EQ(error_of(dir, R"({"precision": {"mode": "tf32", "tf32": false}})"),
            file + ": precision.tf32 = false: precision.mode \"tf32\" means TF32 on; use precision.mode \"fp32\" for "
                   "IEEE float32");
  EXPECT_EQ(error_of(dir, R"({"precision": {"deterministic": true, "cudnn_benchmark": true}})"),
            file + ": precision.cudnn_benchmark = true: cuDNN autotuning picks algorithms by timing, which is not "
                   "deterministic; turn off one of precision.cudnn_benchmark and precision.deterministic");
  EXPECT_EQ(error_of(dir, R"({"precision": {"mode": "fp8"}})"),
            file + ": precision.mode = \"fp8\": expected one of fp32, tf32, fp16, bf16");
}

TEST(Config, InvalidJsonNamesFileAndPosition) {
  TempDir dir;
  const std::string message = error_of(dir, "{\"optim\": {\"lr\": 0.1,}}");
  EXPECT_EQ(message.rfind((dir.path() / "run.json").string() + ": not valid JSON: parse error at line 1, column", 0), 0u)
      << message;
}

TEST(Config, MissingFile) {
  try {
    load_file("/nonexistent/x.json");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_STREQ(error.what(), "/nonexistent/x.json: no such config file (the examples are in configs/)");
  }
}

TEST(Config, ExtendsMergesAndTracksOrigins) {
  TempDir dir;
  write_file(dir.path() / "base.json", R"({"optim": {"lr": 0.2, "momentum": 0.8}, "run": {"epochs": 7}})");
  write_file(dir.path() / "sub" / "child.json", R"({"extends": "../base.json", "optim": {"lr": 0.05}})");
  const LoadedConfig loaded = load_file(dir.path() / "sub" / "child.json");
  EXPECT_DOUBLE_EQ(loaded.config.optim.lr, 0.05);
  EXPECT_DOUBLE_EQ(loaded.config.optim.momentum, 0.8);
  EXPECT_EQ(loaded.config.run.epochs, 7);
  EXPECT_EQ(loaded.origin.at("optim.lr"), (dir.path() / "sub" / "child.json").string());
  EXPECT_EQ(loaded.origin.at("optim.momentum"), (dir.path() / "base.json").string());
}

TEST(Config, ErrorsNameTheFileThatSetTheKey) {
  TempDir dir;
  write_file(dir.path() / "base.json", R"({"optim": {"lr": -1}})");
  write_file(dir.path() / "child.json", R"({"extends": "base.json"})");
  try {
    load_file(dir.path() / "child.json");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), (dir.path() / "base.json").string() + ": optim.lr = -1: expected a number > 0");
  }
}

TEST(Config, ExtendsCycleAndMissingBase) {
  TempDir dir;
  write_file(dir.path() / "a.json", R"({"extends": "b.json"})");
  write_file(dir.path() / "b.json", R"({"extends": "a.json"})");
  EXPECT_THROW(
      {
        try {
          load_file(dir.path() / "a.json");
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("\"extends\" makes a cycle: a.json -> b.json -> a.json"), std::string::npos)
              << e.what();
          throw;
        }
      },
      ConfigError);
  EXPECT_EQ(error_of(dir, R"({"extends": "nope.json"})"),
            (dir.path() / "run.json").string() + ": extends = \"nope.json\": no such file " +
                (dir.path() / "nope.json").string() + " (paths are relative to this file)");
}

TEST(Config, SetOverridesAndParsesValues) {
  TempDir dir;
  write_file(dir.path() / "x.json", R"({"optim": {"lr": 0.2}})");
  const LoadedConfig loaded =
      load_file(dir.path() / "x.json", {"optim.lr=0.05", "model.arch=resnet18", "data.mean=[0.5,0.5,0.5]",
                                        "run.name=2024", "data.horizontal_flip=false"});
  EXPECT_DOUBLE_EQ(loaded.config.optim.lr, 0.05);
  EXPECT_EQ(loaded.config.model.arch, Arch::resnet18);
  EXPECT_EQ(loaded.config.data.mean, (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(loaded.config.run.name, "2024");  // a number typed for a string key stays text
  EXPECT_FALSE(loaded.config.data.horizontal_flip);
  EXPECT_EQ(loaded.origin.at("optim.lr"), "--set optim.lr=0.05");
}

TEST(Config, SetErrors) {
  TempDir dir;
  EXPECT_EQ(error_of(dir, "{}", {"optim.lr"}), "--set optim.lr: expected KEY=VALUE, for example --set optim.lr=0.05");
  EXPECT_EQ(error_of(dir, "{}", {"lr=3"}), "--set lr=3: expected a key of the form section.name, for example optim.lr");
  EXPECT_EQ(error_of(dir, "{}", {"optim.lr=abc"}), "--set optim.lr=abc: optim.lr = \"abc\": expected a number > 0");
  EXPECT_EQ(error_of(dir, "{}", {"optim.lrate=1"}), "--set optim.lrate=1: unknown key \"optim.lrate\": did you mean \"optim.lr\"?");
}

TEST(Config, JsonRoundTrip) {
  TempDir dir;
  write_file(dir.path() / "x.json", R"({"model": {"arch": "resnet34"}, "optim": {"lr": 0.3}})");
  const RunConfig original = load_file(dir.path() / "x.json").config;
  const LoadedConfig again = load_json(to_json(original), "saved");
  EXPECT_EQ(to_json(again.config), to_json(original));
  EXPECT_EQ(again.config.model.arch, Arch::resnet34);
}

TEST(Config, ChangedSettingsNameEachDifferenceAndTakeAbsentKeysAtTheirDefaults) {
  const nlohmann::json current = to_json(RunConfig{});
  nlohmann::json older = current;  // as a checkpoint written before these keys existed saved it
  older["data"].erase("cutout");
  older["model"].erase("own_max_pool");
  EXPECT_TRUE(changed_settings(older, current).empty());
  nlohmann::json changed = current;
  changed["data"]["cutout"] = 8;
  changed["optim"]["lr"] = 0.5;
  EXPECT_EQ(changed_settings(older, changed),
            (std::vector<std::string>{"data.cutout (0 -> 8)", "optim.lr (0.1 -> 0.5)"}));
  EXPECT_EQ(changed_settings(changed, older), (std::vector<std::string>{"optim.lr (0.5 -> 0.1)"}));
}

TEST(Config, TableShowsValuesAndOrigins) {
  TempDir dir;
  write_file(dir.path() / "x.json", R"({"optim": {"lr": 0.3}})");
  const std::string table = format_table(load_file(dir.path() / "x.json", {"run.epochs=2"}));
  EXPECT_NE(table.find("optim.lr"), std::string::npos);
  EXPECT_NE(table.find((dir.path() / "x.json").string()), std::string::npos);
  EXPECT_NE(table.find("--set run.epochs=2"), std::string::npos);
  EXPECT_NE(table.find("resnet50"), std::string::npos);
  EXPECT_NE(table.find("default"), std::string::npos);
}

TEST(Config, DescribeKeysListsEveryKeyWithDefault) {
  const std::string keys = describe_keys();
  EXPECT_NE(keys.find("optim.lr"), std::string::npos);
  EXPECT_NE(keys.find("number > 0"), std::string::npos);
  EXPECT_NE(keys.find("resnet18|resnet34|resnet50|resnet101|resnet152"), std::string::npos);
  EXPECT_NE(keys.find("(default 256)"), std::string::npos);
  const nlohmann::json all = to_json(RunConfig{});
  for (const auto& [section, fields] : all.items())
    for (const auto& [key, value] : fields.items())
      EXPECT_NE(keys.find(section + "." + key), std::string::npos) << section << "." << key;
}

TEST(Config, ShippedConfigsLoad) {
  const auto configs = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs";
  int count = 0;
  for (const auto& file : ltrain::testing::files_below(configs, ".json")) {
    // configs/sweeps/ holds sweep descriptions, whose points are run configs.
    if (file.parent_path().filename() == "sweeps")
      EXPECT_NO_THROW(bench::check_sweep(file)) << file;
    else
      EXPECT_NO_THROW(load_file(file)) << file;
    ++count;
  }
  EXPECT_GT(count, 0);
}

}  // namespace
}  // namespace ltrain::config
