#include <sys/stat.h>

#include <set>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ltrain/bench/claims.h"
#include "ltrain/bench/sweep.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
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

TEST(Config, EveryImpossibleCombinationIsReportedInOneError) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const std::string message =
      error_of(dir, R"({"run": {"epochs": 2}, "optim": {"name": "adamw", "nesterov": true, "lr": 0.01},
                        "schedule": {"warmup_epochs": 3, "min_lr": 0.1}})");
  EXPECT_EQ(message,
            file + ": optim.nesterov = true: Nesterov momentum needs optim.name \"sgd\" and optim.momentum > 0\n" +
                file + ": schedule.warmup_epochs = 3.0: expected fewer epochs than run.epochs (2); lower it, or 0 for "
                       "no warm-up\n" +
                file + ": schedule.min_lr = 0.1: expected at most optim.lr (0.01): the cosine schedule falls from "
                       "optim.lr to it; lower it, or raise optim.lr");
}

TEST(Config, ARecipeShortensWithRunEpochsAlone) {
  TempDir dir;
  const auto recipe = dir.path() / "recipe.json";
  write_file(recipe, R"({"run": {"epochs": 40}, "data": {"progressive_start_size": 16, "progressive_epochs": 24}})");
  // Progressive resizing keeps its share of the run (24 of 40: 60%), the last epoch at full size.
  for (const auto& [epochs, progressive] : std::vector<std::pair<int, int>>{{3, 2}, {10, 6}, {80, 48}, {2, 1}, {1, 0}}) {
    const LoadedConfig loaded = load_file(recipe, {"run.epochs=" + std::to_string(epochs)});
    EXPECT_EQ(loaded.config.data.progressive_epochs, progressive) << epochs;
    EXPECT_EQ(loaded.origin.at("data.progressive_epochs"), "--set run.epochs=" + std::to_string(epochs));
  }
  // Set together, both are taken as given; 0 turns progressive resizing off.
  EXPECT_EQ(load_file(recipe, {"run.epochs=3", "data.progressive_epochs=2"}).config.data.progressive_epochs, 2);
  EXPECT_EQ(load_file(recipe, {"run.epochs=3", "data.progressive_epochs=0"}).config.data.progressive_epochs, 0);
  EXPECT_EQ(error_of(dir, R"({"run": {"epochs": 40}, "data": {"progressive_start_size": 16, "progressive_epochs": 24}})",
                     {"run.epochs=3", "data.progressive_epochs=5"}),
            "--set data.progressive_epochs=5: data.progressive_epochs = 5: expected fewer than run.epochs (3): at "
            "least the last epoch trains at the full side; lower it, or set it to 0 to turn progressive resizing off");
  // A file that sets both is taken as written.
  EXPECT_EQ(load_file(recipe).config.data.progressive_epochs, 24);
  // The shipped recipes shorten to a few epochs.
  const auto accuracy = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs" / "accuracy";
  for (const char* name : {"resnet18-cifar.json", "resnet50-cifar.json", "resnet50-cifar-95.json"})
    EXPECT_NO_THROW(load_file(accuracy / name, {"run.epochs=3"})) << name;
}

TEST(Config, InputsThatWouldFailLaterAreRefusedNamingTheKey) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, "{}", {"run.out_dir="}),
            "--set run.out_dir=: run.out_dir = \"\": expected the folder that holds the run folders (\".\" for the "
            "working directory)");
  EXPECT_EQ(error_of(dir, "{}", {"data.root="}),
            "--set data.root=: data.root = \"\": expected the folder with the data set's files (\".\" for the working "
            "directory)");
  EXPECT_EQ(error_of(dir, R"({"data": {"std": [5e-324, 5e-324, 5e-324]}})"),
            file + ": data.std = [5e-324,5e-324,5e-324]: expected a list of numbers >= 0.001");
  EXPECT_EQ(error_of(dir, R"({"data": {"std": [0.2, -0.2, 0.2]}})"),
            file + ": data.std = [0.2,-0.2,0.2]: expected a list of numbers >= 0.001");
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": 0.1}, "schedule": {"min_lr": 0.2}})"),
            file + ": schedule.min_lr = 0.2: expected at most optim.lr (0.1): the cosine schedule falls from optim.lr "
                   "to it; lower it, or raise optim.lr");
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": 0.1}, "schedule": {"name": "onecycle", "min_lr": 0.2}})"),
            file + ": schedule.min_lr = 0.2: above optim.lr (0.1) and without effect: only the cosine schedule ends at "
                   "it, and schedule.name is onecycle; remove it, or set it at most optim.lr");
  EXPECT_NO_THROW(load_file(dir.path() / "run.json", {"schedule.min_lr=0.1", "optim.lr=0.1"}));
  const std::string allowed = ": expected a folder name: letters, digits, spaces and punctuation, without '/' or '\\', "
                              "control characters or spaces at either end, not \".\" or \"..\"";
  for (const auto& [name, shown] : std::vector<std::pair<std::string, std::string>>{
           {" ", "\" \""}, {"  ", "\"  \""}, {"", "\"\""}, {"a\\b", "\"a\\\\b\""}, {"run ", "\"run \""}, {"..", "\"..\""}})
    EXPECT_EQ(error_of(dir, nlohmann::json{{"run", {{"name", name}}}}.dump()), file + ": run.name = " + shown + allowed);
  // Control characters (a newline, a tab) are refused in every setting, run.name too.
  for (const char* name : {"\n", "\t", "a\x01" "b"}) {
    EXPECT_NE(error_of(dir, "{}", {std::string("run.name=") + name}).find("run.name = "), std::string::npos);
    EXPECT_NE(error_of(dir, "{}", {std::string("run.name=") + name}).find("a control character"), std::string::npos);
  }
  EXPECT_EQ(load_file(dir.path() / "run.json", {"run.name=my run-2.b"}).config.run.name, "my run-2.b");
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
            (dir.path() / "run.json").string() +
                ": unknown key \"loss.focal\"; the keys of loss are: label_smoothing, ltrain_kernels");
}

TEST(Config, UnknownSection) {
  TempDir dir;
  EXPECT_EQ(error_of(dir, R"({"optimizer": {}})"),
            (dir.path() / "run.json").string() + ": unknown key \"optimizer\": did you mean \"optim\"?");
}

TEST(Config, WrongTypes) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": "fast"}})"),
            file + ": optim.lr = \"fast\": expected a number > 0 and <= 1000");
  EXPECT_EQ(error_of(dir, R"({"run": {"epochs": 2.5}})"), file + ": run.epochs = 2.5: expected an integer between 1 and 100000");
  EXPECT_EQ(error_of(dir, R"({"data": {"random_crop": 1}})"), file + ": data.random_crop = 1: expected true or false");
  EXPECT_EQ(error_of(dir, R"({"run": {"name": 7}})"), file + ": run.name = 7: expected a string");
  EXPECT_EQ(error_of(dir, R"({"model": {"arch": "resnet51"}})"),
            file + ": model.arch = \"resnet51\": expected one of resnet18, resnet34, resnet50, resnet101, resnet152, "
                   "wide_resnet50_2, wide_resnet101_2, resnext50_32x4d, resnext101_32x8d, resnext101_64x4d");
  EXPECT_EQ(error_of(dir, R"({"data": {"mean": "0.5"}})"),
            file + ": data.mean = \"0.5\": expected a list of numbers between 0 and 1");
  EXPECT_EQ(error_of(dir, R"({"optim": 3})"), file + ": optim = 3: expected an object of optim keys");
}

TEST(Config, SettingsSpelledOnOrOffTakeTrueAndFalseAsOnceWritten) {
  // cuda_graph.dependent_launch was a boolean: configs written then (every run directory's copy)
  // still load, true as "on" and false as "off"; other spellings are refused as before.
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const auto dependent_launch = [](const std::string& value) {
    return load_json(nlohmann::json::parse(R"({"cuda_graph": {"dependent_launch": )" + value + "}}"), "test")
        .config.cuda_graph.dependent_launch;
  };
  EXPECT_EQ(dependent_launch("true"), DependentLaunch::on);
  EXPECT_EQ(dependent_launch("false"), DependentLaunch::off);
  EXPECT_EQ(dependent_launch(R"("auto")"), DependentLaunch::automatic);
  write_file(file, "{}");
  EXPECT_EQ(load_file(file, {"cuda_graph.branches=false"}).config.cuda_graph.branches, StepBranches::off);
  EXPECT_EQ(error_of(dir, R"({"cuda_graph": {"dependent_launch": "yes"}})"),
            file + ": cuda_graph.dependent_launch = \"yes\": expected one of auto, on, off");
  EXPECT_EQ(error_of(dir, R"({"cuda_graph": {"dependent_launch": 1}})"),
            file + ": cuda_graph.dependent_launch = 1: expected one of auto, on, off");
  // An enumeration without on and off takes no boolean.
  EXPECT_EQ(error_of(dir, R"({"model": {"stem": true}})"),
            file + ": model.stem = true: expected one of imagenet, cifar");
}

TEST(Config, OutOfRange) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": -0.1}})"), file + ": optim.lr = -0.1: expected a number > 0 and <= 1000");
  EXPECT_EQ(error_of(dir, R"({"data": {"batch_size": 0}})"),
            file + ": data.batch_size = 0: expected an integer between 1 and 4194304");
  EXPECT_EQ(error_of(dir, R"({"optim": {"momentum": 1.5}})"),
            file + ": optim.momentum = 1.5: expected a number between 0 and 1");
  EXPECT_EQ(error_of(dir, R"({"data": {"std": [0.2, 0, 0.2]}})"),
            file + ": data.std = [0.2,0,0.2]: expected a list of numbers >= 0.001");
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
            file + ": schedule.warmup_epochs = 3.0: expected fewer epochs than run.epochs (2); lower it, or 0 for no "
                   "warm-up");
  EXPECT_EQ(error_of(dir, R"({"data": {"progressive_start_size": 4, "progressive_epochs": 2}})"),
            file + ": data.progressive_start_size = 4: expected 0 (off) or a side of at least 8 pixels");
  EXPECT_EQ(error_of(dir, R"({"data": {"progressive_start_size": 16}})"),
            file + ": data.progressive_epochs = 0: progressive resizing needs its number of epochs: 1 or more (0: off, "
                   "as data.progressive_start_size 0)");
  EXPECT_EQ(error_of(dir, R"({"run": {"epochs": 4}, "data": {"progressive_start_size": 16, "progressive_epochs": 4}})"),
            file + ": data.progressive_epochs = 4: expected fewer than run.epochs (4): at least the last epoch trains "
                   "at the full side; lower it, or set it to 0 to turn progressive resizing off");
  EXPECT_EQ(error_of(dir, R"({"data": {"mean": [0.5, 0.5]}})"),
            file + ": data.mean = [0.5,0.5]: expected a list of 3 numbers (R, G, B)");
  EXPECT_EQ(error_of(dir, R"({"run": {"device": "gpu"}})"),
            file + ": run.device = \"gpu\": expected auto, cpu, cuda or cuda:N");
  EXPECT_EQ(error_of(dir, R"({"run": {"name": "a/b"}})"),
            file + ": run.name = \"a/b\": expected a folder name: letters, digits, spaces and punctuation, without "
                   "'/' or '\\', control characters or spaces at either end, not \".\" or \"..\"");
  EXPECT_EQ(error_of(dir, R"({"precision": {"mode": "tf32", "tf32": false}})"),
            file + ": precision.tf32 = false: precision.mode \"tf32\" means TF32 on; use precision.mode \"fp32\" for "
                   "IEEE float32");
  EXPECT_EQ(error_of(dir, R"({"precision": {"deterministic": true, "cudnn_benchmark": true}})"),
            file + ": precision.cudnn_benchmark = true: cuDNN autotuning picks algorithms by timing, which is not "
                   "deterministic; turn off one of precision.cudnn_benchmark and precision.deterministic");
  EXPECT_EQ(error_of(dir, R"({"precision": {"mode": "fp8"}})"),
            file + ": precision.mode = \"fp8\": expected one of fp32, tf32, fp16, bf16");
  EXPECT_EQ(error_of(dir, R"({"data": {"cifar100_labels": "coarse"}})"),
            file + ": data.cifar100_labels = \"coarse\": coarse labels are CIFAR-100's and data.source is cifar10; set "
                   "data.source to cifar100 or remove data.cifar100_labels");
  EXPECT_EQ(error_of(dir, R"({"data": {"source": "cifar100", "cifar100_labels": "middle"}})"),
            file + ": data.cifar100_labels = \"middle\": expected one of fine, coarse");
}

TEST(Config, Cifar100GivesItsFolderStatisticsAndClassesToTheKeysLeftOut) {
  TempDir dir;
  write_file(dir.path() / "c100.json", R"({"data": {"source": "cifar100"}})");
  const std::string file = (dir.path() / "c100.json").string();
  const LoadedConfig fine = load_file(dir.path() / "c100.json");
  EXPECT_EQ(fine.config.data.root, "data/cifar-100-binary");
  EXPECT_EQ(fine.config.data.mean, (std::vector<double>{0.5071, 0.4865, 0.4409}));
  EXPECT_EQ(fine.config.data.std, (std::vector<double>{0.2673, 0.2564, 0.2762}));
  EXPECT_EQ(fine.config.model.num_classes, 100);
  // They count as set where data.source was, which the start-up table shows.
  for (const char* key : {"data.root", "data.mean", "data.std", "model.num_classes"})
    EXPECT_EQ(fine.origin.at(key), file) << key;
  EXPECT_NE(format_table(fine).find("  model.num_classes  100"), std::string::npos) << format_table(fine);
  // 20 outputs for the coarse labels; a --set source is the origin.
  write_file(dir.path() / "plain.json", "{}");
  const LoadedConfig coarse =
      load_file(dir.path() / "plain.json", {"data.source=cifar100", "data.cifar100_labels=coarse"});
  EXPECT_EQ(coarse.config.model.num_classes, 20);
  EXPECT_EQ(coarse.config.data.root, "data/cifar-100-binary");
  EXPECT_EQ(coarse.origin.at("model.num_classes"), "--set data.source=cifar100");
  // What a config gives stays, from any file it extends or a --set: only what it leaves out follows.
  write_file(dir.path() / "given.json", R"({"extends": "c100.json", "model": {"num_classes": 150},
    "data": {"root": "/data/c100", "mean": [0.5, 0.5, 0.5]}})");
  const LoadedConfig given = load_file(dir.path() / "given.json", {"data.std=[0.25,0.25,0.25]"});
  EXPECT_EQ(given.config.model.num_classes, 150);
  EXPECT_EQ(given.config.data.root, "/data/c100");
  EXPECT_EQ(given.config.data.mean, (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(given.config.data.std, (std::vector<double>{0.25, 0.25, 0.25}));
  // A saved config (every key present) reads back as it was, and the other sources keep CIFAR-10's.
  EXPECT_EQ(to_json(load_json(to_json(given.config), "saved").config), to_json(given.config));
  EXPECT_EQ(to_json(load_json(to_json(fine.config), "saved").config), to_json(fine.config));
  for (const char* source : {"cifar10", "synthetic"}) {
    const LoadedConfig other = load_file(dir.path() / "plain.json", {std::string("data.source=") + source});
    EXPECT_EQ(other.config.data.root, "data/cifar-10-batches-bin") << source;
    EXPECT_EQ(other.config.data.mean, DataSection{}.mean) << source;
    EXPECT_EQ(other.config.data.std, DataSection{}.std) << source;
    EXPECT_EQ(other.config.model.num_classes, 10) << source;
    EXPECT_EQ(other.origin.count("model.num_classes"), 0u) << source;
  }
}

TEST(Config, DataSummaryNamesTheSourceAndItsClasses) {
  DataSection data;
  EXPECT_EQ(data_summary(data), nlohmann::json::parse(R"({"source": "cifar10", "classes": 10})"));
  data.source = DataSource::cifar100;
  EXPECT_EQ(data_summary(data),
            nlohmann::json::parse(R"({"source": "cifar100", "classes": 100, "cifar100_labels": "fine"})"));
  data.cifar100_labels = Cifar100Labels::coarse;
  EXPECT_EQ(data_summary(data),
            nlohmann::json::parse(R"({"source": "cifar100", "classes": 20, "cifar100_labels": "coarse"})"));
  data.source = DataSource::synthetic;
  EXPECT_EQ(data_summary(data), nlohmann::json::parse(R"({"source": "synthetic", "classes": 10})"));
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
    EXPECT_STREQ(error.what(),
                 "/nonexistent/x.json: no such file; give the path of a run config (the examples are in configs/)");
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
  EXPECT_EQ(loaded.files,
            (std::vector<std::string>{(dir.path() / "sub" / "child.json").string(),
                                      (dir.path() / "base.json").string()}));
}

// Keys renamed since they were introduced keep working under their earlier names, in files,
// overrides and saved configs, with the source of the value kept; a document that sets one setting
// under both names is refused, naming both.
TEST(Config, EarlierNamesOfRenamedKeysAreReadAsTheNamesNow) {
  TempDir dir;
  const auto file = dir.path() / "old.json";
  write_file(file, R"({"model": {"own_batchnorm": false, "own_max_pool": false},
                       "distributed": {"sync_batchnorm": true}})");
  const LoadedConfig loaded = load_file(file, {"model.fused_batchnorm=false"});
  EXPECT_FALSE(loaded.config.model.ltrain_batch_norm);
  EXPECT_FALSE(loaded.config.model.cudnn_batch_norm);
  EXPECT_FALSE(loaded.config.model.ltrain_max_pool);
  EXPECT_TRUE(loaded.config.distributed.sync_batch_norm);
  EXPECT_EQ(loaded.origin.at("model.ltrain_batch_norm"), file.string());
  EXPECT_EQ(loaded.origin.at("model.cudnn_batch_norm"), "--set model.fused_batchnorm=false");
  EXPECT_EQ(loaded.origin.count("model.own_batchnorm"), 0u);
  // A checkpoint's saved config of an earlier ltrain.
  EXPECT_FALSE(load_json({{"model", {{"fused_batchnorm", false}}}}, "saved").config.model.cudnn_batch_norm);
  // What is printed and saved uses the names now.
  const nlohmann::json saved = to_json(loaded.config);
  EXPECT_FALSE(saved["model"].contains("own_batchnorm"));
  EXPECT_EQ(saved["model"]["ltrain_batch_norm"], false);
  EXPECT_TRUE(is_key_or_section("model.own_batchnorm"));

  EXPECT_EQ(error_of(dir, R"({"model": {"own_batchnorm": false, "ltrain_batch_norm": true}})"),
            (dir.path() / "run.json").string() +
                ": model.own_batchnorm and model.ltrain_batch_norm (" + (dir.path() / "run.json").string() +
                ") are one setting under its earlier and its present name; keep model.ltrain_batch_norm");
}

TEST(Config, TheFilesReadAreListedTopFirstThenWhatEachExtendsInOrder) {
  TempDir dir;
  write_file(dir.path() / "top.json", R"({"extends": ["a.json", "b.json"]})");
  write_file(dir.path() / "a.json", R"({"extends": "c.json"})");
  write_file(dir.path() / "b.json", "{}");
  write_file(dir.path() / "c.json", "{}");
  const auto name = [&](const char* file) { return (dir.path() / file).string(); };
  EXPECT_EQ(load_file(dir.path() / "top.json").files,
            (std::vector<std::string>{name("top.json"), name("a.json"), name("c.json"), name("b.json")}));
  EXPECT_TRUE(load_json(nlohmann::json::object(), "document").files.empty());
}

TEST(Config, ErrorsNameTheFileThatSetTheKey) {
  TempDir dir;
  write_file(dir.path() / "base.json", R"({"optim": {"lr": -1}})");
  write_file(dir.path() / "child.json", R"({"extends": "base.json"})");
  try {
    load_file(dir.path() / "child.json");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              (dir.path() / "base.json").string() + ": optim.lr = -1: expected a number > 0 and <= 1000");
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
            (dir.path() / "run.json").string() + ": extends = \"nope.json\": " + (dir.path() / "nope.json").string() +
                ": no such file (paths are relative to this file)");
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
  EXPECT_EQ(error_of(dir, "{}", {"optim.lr=abc"}),
            "--set optim.lr=abc: optim.lr = \"abc\": expected a number > 0 and <= 1000");
  EXPECT_EQ(error_of(dir, "{}", {"optim.lrate=1"}), "--set optim.lrate=1: unknown key \"optim.lrate\": did you mean \"optim.lr\"?");
}

TEST(Config, NestingPastTheLimitIsRefusedBeforeItIsBuilt) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const std::string too_deep = ": objects and lists nested more than 32 deep; a run config has two levels (sections and "
                               "their keys)";
  std::string objects;
  for (int i = 0; i < 20000; ++i) objects += "{\"run\":";
  objects += "1" + std::string(20000, '}');
  // The 33rd object opens at column 225 (7 characters each).
  EXPECT_EQ(error_of(dir, objects), file + ": line 1, column 225" + too_deep);
  EXPECT_EQ(error_of(dir, std::string(100000, '[') + std::string(100000, ']')), file + ": line 1, column 33" + too_deep);
  EXPECT_EQ(error_of(dir, "{}", {"data.mean=" + std::string(100000, '[')}),
            "--set data.mean=" + std::string(70, '[') + "...: line 1, column 33" + too_deep);
  // A document built elsewhere (a checkpoint's saved config) is held to the same limit.
  nlohmann::json deep = 1;
  for (int i = 0; i < 40; ++i) deep = nlohmann::json::array({deep});
  try {
    load_json({{"run", {{"name", deep}}}}, "saved");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), "saved" + too_deep);
  }
}

TEST(Config, StringsWithNulOrInvalidUtf8OrPastTheLimitAreRefused) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const std::string nul = ": a NUL character (\\u0000) cannot be part of a setting; remove it";
  EXPECT_EQ(error_of(dir, R"({"run": {"name": "\u0000"}})"), file + ": run.name = \"\\u0000\"" + nul);
  EXPECT_EQ(error_of(dir, R"({"run": {"name": "ab\u0000"}})"), file + ": run.name = \"ab\\u0000\"" + nul);
  EXPECT_EQ(error_of(dir, "{\"run\": {\"na\\u0000me\": 1}}"),
            file + ": key \"na\\u0000me\" at line 1, column 10" + nul);
  EXPECT_EQ(error_of(dir, "{}", {R"(run.name="\u0000")"}), "--set run.name=\"\\u0000\": run.name = \"\\u0000\"" + nul);
  // Bytes that are not UTF-8 (a lone 0xFF, an overlong '/'), shown as \xNN.
  EXPECT_EQ(error_of(dir, "{}", {"run.name=\xff"}), "--set run.name=\\xFF: not valid UTF-8; write the setting in UTF-8");
  EXPECT_EQ(error_of(dir, "{}", {"run.name=a\xc0\xaf"}),
            "--set run.name=a\\xC0\\xAF: not valid UTF-8; write the setting in UTF-8");
  EXPECT_EQ(error_of(dir, "{\"run\": {\"out_dir\": \"" + std::string(5000, 'n') + "\"}}"),
            file + ": run.out_dir = \"" + std::string(79, 'n') + "...: longer than 4096 bytes; use a shorter one");
}

TEST(Config, ARawNulByteIsRefusedWhereverItIs) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  // After a complete document: what follows (here a wrong type) must not go unread.
  const std::string after = std::string("{\"run\": {\"epochs\": 1}}") + '\0' + "{\"optim\": {\"lr\": \"x\"}}";
  EXPECT_EQ(error_of(dir, after), file + ": not valid JSON: a NUL byte at line 1, column 23: JSON is text; remove it");
  const std::string inside = std::string("{\"run\":\n {\"name\": \"a") + '\0' + "\"}}";
  EXPECT_EQ(error_of(dir, inside), file + ": not valid JSON: a NUL byte at line 2, column 13: JSON is text; remove it");
}

TEST(Config, StringsWithControlCharactersAreRefusedWrittenRawOrEscaped) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const auto control = [](const char* code) {
    return fmt::format(": a control character (\\u{}) cannot be part of a setting; remove it", code);
  };
  // Escaped and raw, the same string gets the same message.
  EXPECT_EQ(error_of(dir, R"({"run": {"name": "a\u0007b"}})"), file + ": run.name = \"a\\u0007b\"" + control("0007"));
  EXPECT_EQ(error_of(dir, "{\"run\": {\"name\": \"a\x07" "b\"}}"), file + ": run.name = \"a\\u0007b\"" + control("0007"));
  EXPECT_EQ(error_of(dir, "{\"data\": {\"root\": \"d\tata\"}}"), file + ": data.root = \"d\\tata\"" + control("0009"));
  EXPECT_EQ(error_of(dir, "{\"run\": {\"out_dir\": \"runs\x7f\"}}"),
            file + ": run.out_dir = \"runs\\x7F\"" + control("007f"));
  EXPECT_EQ(error_of(dir, "{\"run\": {\"na\x01me\": 1}}"),
            file + ": key \"na\\u0001me\" at line 1, column 10" + control("0001"));
  EXPECT_EQ(error_of(dir, "{}", {"run.name=a\tb"}), "--set run.name=a\\x09b: run.name = \"a\\tb\"" + control("0009"));
  // A line break inside a string is most likely a closing quote left out: the syntax error says where.
  const std::string message = error_of(dir, "{\"run\": {\"name\": \"ab\n}}");
  EXPECT_EQ(message.rfind(file + ": not valid JSON: parse error at line ", 0), 0u) << message;
  EXPECT_NE(message.find("control character U+000A (LF)"), std::string::npos) << message;
}

TEST(Config, NumbersPastWhatTheCodeHoldsAreRefused) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const std::string overflow = ": the number is out of range (a double holds about +-1.8e308); use a smaller one";
  EXPECT_EQ(error_of(dir, R"({"optim": {"lr": 1e999}})"), file + ": optim.lr = 1e999" + overflow);
  EXPECT_EQ(error_of(dir, R"({"data": {"mean": [0.5, -1e999, 0.5]}})"), file + ": data.mean[1] = -1e999" + overflow);
  EXPECT_EQ(error_of(dir, "{}", {"optim.lr=1e999"}), "--set optim.lr=1e999: optim.lr = 1e999" + overflow);
  // Past int64: an unsigned JSON number does not wrap around.
  EXPECT_EQ(error_of(dir, R"({"run": {"seed": 18446744073709551615}})"),
            file + ": run.seed = 18446744073709551615: expected an integer >= 0");
  const auto set_error = [&dir](const std::string& spec) { return error_of(dir, "{}", {spec}); };
  EXPECT_EQ(set_error("data.eval_batch_size=9223372036854775807"),
            "--set data.eval_batch_size=9223372036854775807: data.eval_batch_size = 9223372036854775807: expected an "
            "integer between 1 and 4194304");
  EXPECT_EQ(set_error("model.width=9223372036854775807"),
            "--set model.width=9223372036854775807: model.width = 9223372036854775807: expected an integer between 1 "
            "and 256");
  EXPECT_EQ(set_error("model.num_classes=2147483648"),
            "--set model.num_classes=2147483648: model.num_classes = 2147483648: expected an integer between 2 and "
            "100000");
  EXPECT_EQ(set_error("data.synthetic_train_size=9223372036854775807"),
            "--set data.synthetic_train_size=9223372036854775807: data.synthetic_train_size = 9223372036854775807: "
            "expected an integer between 1 and 4194304");
  EXPECT_EQ(set_error("schedule.final_div_factor=1e-308"),
            "--set schedule.final_div_factor=1e-308: schedule.final_div_factor = 1e-308: expected a number between 1 "
            "and 1000000000");
  EXPECT_EQ(set_error("run.epochs=4294967297"),
            "--set run.epochs=4294967297: run.epochs = 4294967297: expected an integer between 1 and 100000");
}

TEST(Config, PathsWithNamesTheSystemRefusesAreConfigErrors) {
  TempDir dir;
  const std::string long_name(300, 'w');
  EXPECT_EQ(error_of(dir, "{}", {"model.init_from=" + long_name}),
            "--set model.init_from=" + std::string(64, 'w') + "...: model.init_from = \"" + std::string(79, 'w') +
                "...: a file or folder name in this path is longer than 255 bytes; use a shorter path");
  EXPECT_EQ(error_of(dir, "{}", {"run.out_dir=/tmp/" + long_name + "/runs"}).substr(0, 5), "--set");
  EXPECT_EQ(error_of(dir, "{}", {"run.name=" + std::string(256, 'n')}),
            "--set run.name=" + std::string(71, 'n') + "...: run.name = \"" + std::string(79, 'n') +
                "...: expected a folder name of at most 255 bytes");
}

TEST(Config, KeysSetTwiceInOneTextAreRefusedNamingBothPlaces) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, "{\"optim\": {\"lr\": 0.1,\n           \"lr\": 0.2}}"),
            file + ": \"optim.lr\" is set twice, at line 1, column 12 and at line 2, column 12; keep one");
  EXPECT_EQ(error_of(dir, R"({"optim": {}, "optim": {}})"),
            file + ": \"optim\" is set twice, at line 1, column 2 and at line 1, column 15; keep one");
  EXPECT_EQ(error_of(dir, "{}", {R"(optim={"lr":1,"lr":2})"}),
            R"(--set optim={"lr":1,"lr":2}: "optim.lr" is set twice, at line 1, column 2 and at line 1, column 9; keep one)");
  // A key with an escaped quote is located from its opening quote.
  EXPECT_EQ(error_of(dir, R"({"a\"b": 1, "a\"b": 2})"),
            file + ": \"a\"b\" is set twice, at line 1, column 2 and at line 1, column 13; keep one");
}

TEST(Config, SetTakesJsonListsAndObjects) {
  TempDir dir;
  write_file(dir.path() / "x.json", R"({"optim": {"lr": 0.2}})");
  const LoadedConfig loaded =
      load_file(dir.path() / "x.json", {"data.mean=[0.5,0.5,0.5]", R"(optim={"lr":0.05,"momentum":0.8})"});
  EXPECT_EQ(loaded.config.data.mean, (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_DOUBLE_EQ(loaded.config.optim.lr, 0.05);
  EXPECT_DOUBLE_EQ(loaded.config.optim.momentum, 0.8);
  EXPECT_EQ(loaded.origin.at("optim.momentum"), R"(--set optim={"lr":0.05,"momentum":0.8})");
  EXPECT_EQ(error_of(dir, "{}", {"optim=3"}), "--set optim=3: expected a key of the form section.name, for example optim.lr");
  EXPECT_EQ(error_of(dir, "{}", {R"(optim={"lrr":1})"}),
            R"(--set optim={"lrr":1}: unknown key "optim.lrr": did you mean "optim.lr"?)");
}

TEST(Config, FilesThatAreNotRegularAreRefusedBeforeReading) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  const std::string hint = "; give the path of a run config (the examples are in configs/)";
  try {
    load_file(dir.path());
    FAIL() << "a directory was read as a config";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), dir.path().string() + ": is a directory, not a file" + hint);
  }
  // A FIFO would wait for a writer; /dev/zero never ends.
  ASSERT_EQ(::mkfifo((dir.path() / "pipe").c_str(), 0600), 0);
  try {
    load_file(dir.path() / "pipe");
    FAIL() << "a FIFO was read as a config";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), (dir.path() / "pipe").string() + ": is a FIFO (named pipe), not a file" + hint);
  }
  EXPECT_EQ(error_of(dir, R"({"extends": "pipe"})"),
            file + ": extends = \"pipe\": " + (dir.path() / "pipe").string() +
                ": is a FIFO (named pipe), not a file (paths are relative to this file)");
  EXPECT_EQ(error_of(dir, R"({"extends": "/dev/zero"})"),
            file + ": extends = \"/dev/zero\": /dev/zero: is a character device, not a file (paths are relative to this "
                   "file)");
  EXPECT_EQ(error_of(dir, "{}" + std::string(5 << 20, ' ')), file + ": is larger than 4 MiB" + hint);
}

TEST(Config, LongValuesAreCutInMessages) {
  TempDir dir;
  const std::string file = (dir.path() / "run.json").string();
  EXPECT_EQ(error_of(dir, "{\"optim\": {\"lr\": \"" + std::string(1000, 'f') + "\"}}"),
            file + ": optim.lr = \"" + std::string(79, 'f') + "...: expected a number > 0 and <= 1000");
  EXPECT_EQ(shown(std::string(100, 'x')), std::string(80, 'x') + "...");
  EXPECT_EQ(shown("tab\there\n\xff"), "tab\\x09here\\x0A\\xFF");
  EXPECT_EQ(shown("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 stays as it is
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
  older["model"].erase("ltrain_max_pool");
  EXPECT_TRUE(changed_settings(older, current).empty());
  nlohmann::json changed = current;
  changed["data"]["cutout"] = 8;
  changed["optim"]["lr"] = 0.5;
  EXPECT_EQ(changed_settings(older, changed),
            (std::vector<std::string>{"data.cutout (0 -> 8)", "optim.lr (0.1 -> 0.5)"}));
  EXPECT_EQ(changed_settings(changed, older), (std::vector<std::string>{"optim.lr (0.5 -> 0.1)"}));
}

TEST(Config, TableShowsTheSettingsThatDifferFromTheDefaultsWithTheirOrigins) {
  TempDir dir;
  // optim.momentum is set, but to its default: not a difference.
  write_file(dir.path() / "x.json", R"({"optim": {"lr": 0.3, "momentum": 0.9}, "model": {"arch": "resnet18"}})");
  const std::string file = (dir.path() / "x.json").string();
  EXPECT_EQ(format_table(load_file(dir.path() / "x.json", {"run.epochs=2"})),
            fmt::format("3 settings differ from the defaults:\n"
                        "  key         value     from\n"
                        "  run.epochs  2         --set run.epochs=2\n"
                        "  model.arch  resnet18  {}\n"
                        "  optim.lr    0.3       {}\n",
                        file, file));
  EXPECT_EQ(format_table(load_json(nlohmann::json::parse(R"({"data": {"batch_size": 64}})"), "saved.json")),
            "1 setting differs from the defaults:\n"
            "  key              value  from\n"
            "  data.batch_size  64     saved.json\n");
  EXPECT_EQ(format_table(load_json(nlohmann::json::object(), "empty")), "every setting is at its default\n");
}

/// `text` with the lines that continue a key's description joined to it: one line per key.
std::string unwrapped(std::string text) {
  const std::string continuation = "\n" + std::string(32, ' ');
  for (size_t at = text.find(continuation); at != std::string::npos; at = text.find(continuation, at))
    text.replace(at, continuation.size(), " ");
  return text;
}

TEST(Config, DescribeKeysListsEveryKeyWithItsDescriptionTypeAndDefault) {
  const std::string wrapped = describe_keys();
  const std::string keys = unwrapped(wrapped);
  EXPECT_NE(keys.find("  optim.lr "), std::string::npos);
  EXPECT_NE(keys.find("peak learning rate; the schedule scales it (number > 0 and <= 1000, default 0.1)"),
            std::string::npos)
      << keys;
  EXPECT_NE(keys.find("(resnet18 | resnet34 | resnet50 | resnet101 | resnet152 | wide_resnet50_2 | wide_resnet101_2 | "
                      "resnext50_32x4d | resnext101_32x8d | resnext101_64x4d, default \"resnet50\")"),
            std::string::npos);
  EXPECT_NE(keys.find("default 256)"), std::string::npos);
  const nlohmann::json all = to_json(RunConfig{});
  for (const auto& [section, fields] : all.items())
    for (const auto& [key, value] : fields.items())
      EXPECT_NE(keys.find("  " + section + "." + key + " "), std::string::npos) << section << "." << key;
  EXPECT_NE(keys.find("  precision.max_consecutive_skipped_steps fp16: stop the run after more skipped steps"),
            std::string::npos);  // a key longer than its column: the description on the next line
  // Wrapped, never past 110 columns.
  std::istringstream lines(wrapped);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 110u) << line;
}

TEST(Config, EveryKeyHasADescriptionAndEveryEnumItsChoices) {
  const ConfigKeys& described = config_keys();
  const nlohmann::json all = to_json(RunConfig{});
  size_t count = 0;
  for (const auto& [section, fields] : all.items()) count += fields.size();
  ASSERT_EQ(described.keys.size(), count);
  EXPECT_EQ(described.sections.size(), all.size());
  for (const KeyInfo& key : described.keys) {
    EXPECT_FALSE(key.description.empty()) << key.name;
    EXPECT_EQ(key.description.find('\n'), std::string::npos) << key.name;
    const auto dot = key.name.find('.');
    EXPECT_EQ(key.default_value, all[key.name.substr(0, dot)][key.name.substr(dot + 1)]) << key.name;
  }
  const auto find = [&](const std::string& name) {
    return *std::find_if(described.keys.begin(), described.keys.end(), [&](const KeyInfo& k) { return k.name == name; });
  };
  EXPECT_EQ(find("precision.mode").choices, (std::vector<std::string>{"fp32", "tf32", "fp16", "bf16"}));
  EXPECT_EQ(find("model.channels_last").choices, (std::vector<std::string>{"true", "false"}));
  EXPECT_TRUE(find("optim.lr").choices.empty());
  for (const SectionInfo& section : described.sections) EXPECT_FALSE(section.description.empty()) << section.name;
  EXPECT_TRUE(is_key_or_section("optim.lr"));
  EXPECT_TRUE(is_key_or_section("optim"));
  EXPECT_FALSE(is_key_or_section("optim.lrr"));
  EXPECT_FALSE(is_key_or_section("lr"));
}

TEST(Config, SchemaHoldsTypesEnumsLimitsDefaultsAndDescriptions) {
  const nlohmann::ordered_json schema = json_schema();
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(schema["additionalProperties"], false);
  EXPECT_TRUE(schema["properties"].contains("extends"));
  const auto& optim = schema["properties"]["optim"];
  EXPECT_EQ(optim["type"], "object");
  EXPECT_EQ(optim["additionalProperties"], false);
  EXPECT_EQ(optim["properties"]["lr"],
            nlohmann::ordered_json::parse(R"({"type": "number", "exclusiveMinimum": 0.0, "maximum": 1000.0,
              "default": 0.1, "description": "peak learning rate; the schedule scales it"})"));
  EXPECT_EQ(optim["properties"]["accumulation_steps"]["type"], "integer");
  EXPECT_EQ(optim["properties"]["accumulation_steps"]["minimum"], 1);
  EXPECT_EQ(optim["properties"]["accumulation_steps"]["maximum"], 1024);
  EXPECT_EQ(optim["properties"]["betas"]["items"]["maximum"], 1.0);
  EXPECT_EQ(schema["properties"]["model"]["properties"]["arch"]["enum"],
            nlohmann::ordered_json::parse(R"(["resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
              "wide_resnet50_2", "wide_resnet101_2", "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d"])"));
  EXPECT_EQ(schema["properties"]["run"]["properties"]["seed"],
            nlohmann::ordered_json::parse(R"({"type": "integer", "minimum": 0, "default": 0,
              "description": "seed of initialization, epoch order and augmentation"})"));
  EXPECT_FALSE(schema["properties"]["run"]["properties"]["seed"].contains("maximum"));  // no upper limit
}

/// The ways `value` breaks `schema`, for the part of JSON Schema that json_schema() writes (a
/// keyword it does not know is itself reported, so the schema cannot outgrow this checker).
void check_against(const nlohmann::ordered_json& schema, const nlohmann::json& value, const std::string& path,
                   std::vector<std::string>& problems) {
  static const std::set<std::string> known{"$schema", "title",      "description", "default",
                                           "type",    "enum",       "minimum",     "exclusiveMinimum",
                                           "maximum", "properties", "additionalProperties", "items", "anyOf"};
  for (const auto& [keyword, unused] : schema.items())
    if (!known.count(keyword)) problems.push_back(path + ": unknown schema keyword " + keyword);
  if (schema.contains("anyOf")) {
    bool matched = false;
    for (const auto& option : schema["anyOf"]) {
      std::vector<std::string> option_problems;
      check_against(option, value, path, option_problems);
      matched = matched || option_problems.empty();
    }
    if (!matched) problems.push_back(path + ": matches none of anyOf");
  }
  if (schema.contains("type")) {
    const std::string type = schema["type"];
    const bool fits = type == "object"    ? value.is_object()
                      : type == "array"   ? value.is_array()
                      : type == "string"  ? value.is_string()
                      : type == "boolean" ? value.is_boolean()
                      : type == "integer" ? value.is_number_integer()
                      : type == "number"  ? value.is_number()
                                          : false;
    if (!fits) {
      problems.push_back(path + ": not of type " + type);
      return;
    }
  }
  if (schema.contains("enum") &&
      std::find(schema["enum"].begin(), schema["enum"].end(), nlohmann::ordered_json(value)) == schema["enum"].end())
    problems.push_back(path + ": not one of the enum");
  if (value.is_number()) {
    const double number = value.get<double>();
    if (schema.contains("minimum") && number < schema["minimum"].get<double>())
      problems.push_back(path + ": below minimum");
    if (schema.contains("exclusiveMinimum") && number <= schema["exclusiveMinimum"].get<double>())
      problems.push_back(path + ": not above exclusiveMinimum");
    if (schema.contains("maximum") && number > schema["maximum"].get<double>())
      problems.push_back(path + ": above maximum");
  }
  if (value.is_object() && schema.contains("properties")) {
    for (const auto& [key, child] : value.items()) {
      if (schema["properties"].contains(key))
        check_against(schema["properties"][key], child, path + "." + key, problems);
      else if (schema.value("additionalProperties", true) == false)
        problems.push_back(path + "." + key + ": not allowed");
    }
  }
  if (value.is_array() && schema.contains("items"))
    for (size_t i = 0; i < value.size(); ++i)
      check_against(schema["items"], value[i], path + "[" + std::to_string(i) + "]", problems);
}

std::vector<std::string> schema_problems(const nlohmann::json& document) {
  std::vector<std::string> problems;
  check_against(json_schema(), document, "", problems);
  return problems;
}

TEST(Config, ShippedConfigsAndTheDefaultsValidateAgainstTheSchema) {
  const auto configs = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs";
  int count = 0;
  for (const auto& file : ltrain::testing::files_below(configs, ".json")) {
    // Sweep descriptions and the guides' claims (configs/claims/), not run configs.
    if (file.parent_path().filename() == "sweeps" || file.parent_path().filename() == "claims") continue;
    EXPECT_EQ(schema_problems(nlohmann::json::parse(testing::read_file(file))), std::vector<std::string>{}) << file;
    ++count;
  }
  EXPECT_GT(count, 20);
  EXPECT_EQ(schema_problems(to_json(RunConfig{})), std::vector<std::string>{});
  // What the reader refuses, the schema refuses too: unknown keys, wrong types, values past the limits.
  for (const char* text : {R"({"optim": {"lrr": 0.1}})", R"({"optimizer": {}})", R"({"optim": {"lr": 0}})",
                           R"({"optim": {"lr": 1001}})", R"({"run": {"epochs": 1.5}})", R"({"run": {"seed": -1}})",
                           R"({"model": {"arch": "resnet9"}})", R"({"data": {"mean": [0.5, 2, 0.5]}})",
                           R"({"model": {"channels_last": 1}})", R"({"extends": 3})", R"({"run": "x"})",
                           R"({"cuda_graph": {"dependent_launch": "yes"}})", R"({"model": {"stem": false}})"}) {
    const nlohmann::json document = nlohmann::json::parse(text);
    EXPECT_FALSE(schema_problems(document).empty()) << text;
    EXPECT_THROW(load_json(document, "test"), ConfigError) << text;
  }
  EXPECT_EQ(schema_problems(nlohmann::json::parse(R"({"extends": ["a.json", "b.json"], "optim": {"lr": 1000}})")),
            std::vector<std::string>{});
  // A setting spelled on/off takes true and false too, in the schema as in the reader.
  for (const char* value : {"true", "false", R"("auto")", R"("on")"})
    EXPECT_EQ(schema_problems(nlohmann::json::parse(std::string(R"({"cuda_graph": {"dependent_launch": )") + value + "}}")),
              std::vector<std::string>{})
        << value;
}

TEST(Config, SweepSchemaDescribesEverySweepKeyAndTheShippedSweepsFollowIt) {
  const nlohmann::ordered_json schema = sweep_schema();
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(schema["additionalProperties"], false);
  const ConfigKeys& described = sweep_keys();
  for (const KeyInfo& key : described.keys) {
    const auto dot = key.name.find('.');
    const auto& properties = dot == std::string::npos ? schema["properties"]
                                                      : schema["properties"][key.name.substr(0, dot)]["properties"];
    ASSERT_TRUE(properties.contains(key.name.substr(dot + 1))) << key.name;
    EXPECT_EQ(properties[key.name.substr(dot + 1)], key.schema) << key.name;
    EXPECT_FALSE(key.description.empty()) << key.name;
  }
  for (const SectionInfo& section : described.sections) {
    EXPECT_EQ(schema["properties"][section.name]["type"], "object") << section.name;
    EXPECT_EQ(schema["properties"][section.name]["additionalProperties"], false) << section.name;
  }
  EXPECT_EQ(schema["properties"]["mode"]["enum"], nlohmann::ordered_json::parse(R"(["bench", "train"])"));
  EXPECT_EQ(schema["properties"]["bench"]["properties"]["steps"],
            nlohmann::ordered_json::parse(R"({"type": "integer", "minimum": 1, "maximum": 1000000, "default": 30,
              "description": "steps timed per round"})"));
  // grid and zip take every run config key and section, each with a list of that key's values.
  for (const char* lists : {"grid", "zip"}) {
    const auto& keys = schema["properties"][lists]["properties"];
    EXPECT_EQ(keys.size(), config_keys().keys.size() + config_keys().sections.size()) << lists;
    EXPECT_EQ(keys["optim.lr"]["items"],
              nlohmann::ordered_json::parse(R"({"type": "number", "exclusiveMinimum": 0.0, "maximum": 1000.0})"));
    EXPECT_EQ(keys["optim"]["items"]["properties"]["lr"], json_schema()["properties"]["optim"]["properties"]["lr"]);
  }
  // A sweep's keys and sections are named apart from a run config's sections: an override names one or the other.
  for (const SectionInfo& section : config_keys().sections) EXPECT_FALSE(is_sweep_key_or_section(section.name));
  EXPECT_TRUE(is_sweep_key_or_section("bench"));
  EXPECT_TRUE(is_sweep_key_or_section("bench.steps"));
  EXPECT_TRUE(is_sweep_key_or_section("mode"));
  EXPECT_FALSE(is_sweep_key_or_section("bench.stepss"));

  const auto sweeps = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs" / "sweeps";
  int count = 0;
  for (const auto& file : ltrain::testing::files_below(sweeps, ".json")) {
    std::vector<std::string> problems;
    check_against(schema, nlohmann::json::parse(testing::read_file(file)), "", problems);
    EXPECT_EQ(problems, std::vector<std::string>{}) << file;
    ++count;
  }
  EXPECT_EQ(count, 3);
  // What the reader refuses, the schema refuses too.
  for (const char* text : {R"({"bench": {"stepss": 5}})", R"({"grid": {"optim.lrr": [0.1]}})", R"({"mode": "fit"})",
                           R"({"set": "run.seed=1"})", R"({"batch_search": {"refine": -1}})", R"({"gird": {}})",
                           R"({"grid": {"optim.lr": 0.1}})", R"({"bench": {"steps": 0}})"}) {
    std::vector<std::string> problems;
    check_against(schema, nlohmann::json::parse(text), "", problems);
    EXPECT_FALSE(problems.empty()) << text;
  }
}

TEST(Config, ShippedConfigsLoad) {
  const auto configs = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs";
  int count = 0;
  for (const auto& file : ltrain::testing::files_below(configs, ".json")) {
    // configs/sweeps/ holds sweep descriptions, whose points are run configs; configs/claims/ the
    // claims `ltrain reproduce` measures.
    if (file.parent_path().filename() == "sweeps")
      EXPECT_NO_THROW(bench::plan_sweep(file)) << file;
    else if (file.parent_path().filename() == "claims")
      EXPECT_NO_THROW(bench::load_claims(file)) << file;
    else
      EXPECT_NO_THROW(load_file(file)) << file;
    ++count;
  }
  EXPECT_GT(count, 0);
}

TEST(Config, ArticleConfigsHoldTheGuidesRecipes) {
  // Each guide's recipe as `ltrain train --print-config` resolves it: torchvision's resnet50 (the
  // imagenet stem, 1000 outputs), the guide's optimizer with PyTorch's defaults, batch, epochs,
  // inputs (ToTensor only, or Normalize(0.5, 0.5)), no augmentation, fp16 with a GradScaler.
  const auto articles = std::filesystem::path(LTRAIN_SOURCE_DIR) / "configs" / "articles";
  testing::TempDir dir;
  const auto resolved = [&](const std::string& name) {
    const auto out = dir.path() / (name + ".out");
    EXPECT_EQ(testing::run_ltrain("train --print-config --config " + (articles / (name + ".json")).string(), out), 0);
    return nlohmann::json::parse(testing::read_file(out));
  };
  struct Recipe {
    std::string name;
    int64_t batch_size;
    int64_t epochs;
    std::string optimizer;
    double lr;
    double weight_decay;
    bool shuffle;
    bool normalize;
  };
  for (const Recipe& recipe : {Recipe{"5090-guide", 256, 100, "sgd", 0.1, 0.0, false, false},
                               Recipe{"4090-guide", 256, 100, "sgd", 0.1, 0.0, true, false},
                               Recipe{"4090d-guide", 512, 10, "adamw", 0.001, 0.01, true, true}}) {
    SCOPED_TRACE(recipe.name);
    const nlohmann::json c = resolved(recipe.name);
    EXPECT_EQ(c["model"]["arch"], "resnet50");
    EXPECT_EQ(c["model"]["stem"], "imagenet");
    EXPECT_EQ(c["model"]["num_classes"], 1000);
    EXPECT_EQ(c["model"]["zero_init_residual"], false);
    EXPECT_EQ(c["data"]["batch_size"], recipe.batch_size);
    EXPECT_EQ(c["data"]["shuffle"], recipe.shuffle);
    EXPECT_EQ(c["data"]["random_crop"], false);
    EXPECT_EQ(c["data"]["horizontal_flip"], false);
    EXPECT_EQ(c["data"]["normalize"], recipe.normalize);
    EXPECT_EQ(c["run"]["epochs"], recipe.epochs);
    EXPECT_EQ(c["optim"]["name"], recipe.optimizer);
    EXPECT_DOUBLE_EQ(c["optim"]["lr"].get<double>(), recipe.lr);
    EXPECT_DOUBLE_EQ(c["optim"]["weight_decay"].get<double>(), recipe.weight_decay);
    EXPECT_EQ(c["optim"]["accumulation_steps"], 1);
    EXPECT_EQ(c["schedule"]["name"], "constant");
    EXPECT_EQ(c["loss"]["label_smoothing"], 0.0);
    EXPECT_EQ(c["precision"]["mode"], "fp16");
    if (recipe.optimizer == "sgd") {
      EXPECT_EQ(c["optim"]["momentum"], 0.0);
      EXPECT_EQ(c["optim"]["nesterov"], false);
    } else {
      EXPECT_EQ(c["optim"]["betas"], nlohmann::json::array({0.9, 0.999}));
      EXPECT_EQ(c["optim"]["eps"], 1e-8);
      EXPECT_EQ(c["data"]["mean"], nlohmann::json::array({0.5, 0.5, 0.5}));
      EXPECT_EQ(c["data"]["std"], nlohmann::json::array({0.5, 0.5, 0.5}));
    }
  }
}

}  // namespace
}  // namespace ltrain::config
