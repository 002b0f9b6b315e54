// ltrain sweep: grids in bench and train mode, failing points as rows, the batch-size search's
// refusal on the CPU, the results files and their plot.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "ltrain/bench/sweep.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/sha256.h"
#include "support.h"

namespace ltrain::bench {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_ltrain;
using testing::run_ltrain_within;
using testing::TempDir;
using testing::write_file;

/// A tiny CPU run config in `dir`/base.json, and a sweep over it in `dir`/sweep.json.
fs::path write_sweep(const TempDir& dir, const std::string& sweep_body) {
  write_file(dir.path() / "base.json", R"({"run": {"device": "cpu", "epochs": 1, "log_every_steps": 4,
      "out_dir": ")" + (dir.path() / "unused-runs").string() + R"("},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4},
    "data": {"source": "synthetic", "synthetic_train_size": 128, "synthetic_test_size": 32, "batch_size": 32}})");
  write_file(dir.path() / "sweep.json", R"({"base": "base.json", )" + sweep_body + "}");
  return dir.path() / "sweep.json";
}

/// The message of the one line ltrain wrote to `log` for a user error, without its time and level.
std::string error_line(const fs::path& log) {
  const std::string out = read_file(log);
  const auto level = out.find("] error ");
  if (level == std::string::npos || std::count(out.begin(), out.end(), '\n') != 1 || out.back() != '\n')
    return "(not one error line) " + out;
  return out.substr(level + 8, out.size() - level - 9);
}

TEST(Sweep, BenchGridWithAFailingPointBecomesRows) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("mode": "bench", "bench": {"warmup": 1, "steps": 2},
      "grid": {"precision.mode": ["fp32", "bf16"], "data.batch_size": [16, 32], "model.checkpoint_segments": [0, 9]})");
  const SweepResult result = run_sweep(file, dir.path() / "out");
  ASSERT_EQ(result.points.size(), 8u);
  EXPECT_TRUE(result.finished);
  // The grid's keys in the file's order, the first varying slowest.
  EXPECT_EQ(result.keys, (std::vector<std::string>{"precision.mode", "data.batch_size", "model.checkpoint_segments"}));
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(result.points[i].settings[0].second, i < 4 ? "fp32" : "bf16");
    if (result.points[i].settings[2].second == 9) {
      // 9 segments of ResNet-18's 8 blocks: found as the point's model is built, reported as its row.
      EXPECT_NE(result.points[i].error.find("model.checkpoint_segments"), std::string::npos) << result.points[i].error;
      continue;
    }
    EXPECT_TRUE(result.points[i].error.empty()) << result.points[i].error;
    // img/s is the batch over the median round's step time, and that round lies within the rounds' range.
    const std::map<std::string, double>& values = result.points[i].values;
    const double batch = result.points[i].settings[1].second.get<double>();
    EXPECT_NEAR(values.at("img_per_s") * values.at("ms_per_step") / 1e3, batch, 1e-6 * batch);
    EXPECT_LE(values.at("img_per_s_low"), values.at("img_per_s"));
    EXPECT_LE(values.at("img_per_s"), values.at("img_per_s_high"));
    EXPECT_GT(values.at("img_per_s_low"), 0.0);
  }

  const std::string table = write_sweep_results(result, dir.path() / "out");
  EXPECT_EQ(table.substr(0, table.find('\n')),
            "| precision.mode | data.batch_size | model.checkpoint_segments | img_per_s | img_per_s_low | img_per_s_high "
            "| ms_per_step | peak_gib | reserved_gib | memory_fraction | error |");
  const std::string csv = read_file(dir.path() / "out" / "results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 9);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "precision.mode,data.batch_size,model.checkpoint_segments,img_per_s,img_per_s_low,img_per_s_high,"
            "ms_per_step,peak_gib,reserved_gib,memory_fraction,error");
  EXPECT_EQ(csv.substr(csv.find('\n') + 1, 10), "fp32,16,0,");
  const nlohmann::json saved = nlohmann::json::parse(read_file(dir.path() / "out" / "results.json"));
  ASSERT_EQ(saved["rows"].size(), 8u);
  EXPECT_EQ(saved["finished"], true);
  EXPECT_EQ(saved["rows"][4]["precision.mode"], "bf16");
  EXPECT_TRUE(saved["rows"][0]["error"].is_null());
  EXPECT_TRUE(saved["rows"][7]["error"].is_string());
  // Where the results come from: the sweep file, then the base config it names.
  const nlohmann::json& provenance = saved["provenance"];
  EXPECT_EQ(provenance["config_files"], (nlohmann::json{file.string(), (dir.path() / "base.json").string()}));
  const std::string base = config::to_json(config::load_file(dir.path() / "base.json").config).dump();
  EXPECT_EQ(provenance["config_sha256"], sha256_hex(base.data(), base.size()));
  EXPECT_EQ(provenance["ltrain_version"], LTRAIN_VERSION);
  EXPECT_TRUE(provenance["started_at"].is_string());

  // The plot script reads those files.
  LTRAIN_REQUIRE_PYTHON(python, "matplotlib");
  ASSERT_EQ(testing::run_plot_script(python, "plot_sweep.py", (dir.path() / "out").string(), dir.path() / "plot.log"), 0)
      << read_file(dir.path() / "plot.log");
  const std::string png = read_file(dir.path() / "out" / "results.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
}

TEST(Sweep, TrainModeRunsEachPointToTheEndAndItsCurvesPlot) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("mode": "train", "grid": {"optim.lr": [0.01, 0.05]})");
  const SweepResult result = run_sweep(file, dir.path() / "out");
  ASSERT_EQ(result.points.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(result.points[i].error.empty()) << result.points[i].error;
    // A point's accuracy is its own run's: what its summary.json says and what the evaluation
    // wrote in the last epoch's metrics row, a count of the 32 test images over 32.
    // Its folder says what it holds: its number, then its settings.
    const fs::path run = dir.path() / "out" / "runs" / (i == 0 ? "point-000-optim.lr=0.01" : "point-001-optim.lr=0.05");
    ASSERT_TRUE(fs::exists(run / "summary.json"));
    const nlohmann::json summary = nlohmann::json::parse(read_file(run / "summary.json"));
    const double accuracy = result.points[i].values.at("test_acc");
    EXPECT_EQ(accuracy, summary["final_test_accuracy"].get<double>());
    EXPECT_EQ(result.points[i].values.at("best_test_acc"), summary["best_test_accuracy"].get<double>());
    std::istringstream rows(read_file(run / "metrics.jsonl"));
    std::optional<nlohmann::json> last_epoch;
    for (std::string line; std::getline(rows, line);) {
      nlohmann::json row = nlohmann::json::parse(line);
      if (row["kind"] == "epoch") last_epoch = std::move(row);
    }
    ASSERT_TRUE(last_epoch.has_value());
    EXPECT_EQ(accuracy, (*last_epoch)["test_acc"].get<double>());
    EXPECT_EQ(accuracy * 32, std::round(accuracy * 32)) << accuracy;
  }
  // A run directory's curves, the two runs over one another.
  LTRAIN_REQUIRE_PYTHON(python, "matplotlib");
  const fs::path runs = dir.path() / "out" / "runs";
  ASSERT_EQ(testing::run_plot_script(python, "plot_run.py",
                                     (runs / "point-000-optim.lr=0.01").string() + " " +
                                         (runs / "point-001-optim.lr=0.05").string(),
                                     dir.path() / "plot.log"),
            0)
      << read_file(dir.path() / "plot.log");
  EXPECT_EQ(read_file(runs / "point-000-optim.lr=0.01" / "curves.png").substr(1, 3), "PNG");
  EXPECT_EQ(testing::run_plot_script(python, "plot_run.py", (dir.path() / "nothing").string(), dir.path() / "plot.log"),
            3);
}

/// Runs a search plan against a device where each image takes `fraction_per_image` of the memory
/// and a batch over `fail_above` images runs out of it; returns the batches tried, in order.
std::vector<int64_t> search_batches(const BatchSearch& search, double fraction_per_image, int64_t fail_above) {
  BatchSearchPlan plan(search);
  std::vector<int64_t> tried;
  while (const std::optional<int64_t> batch = plan.next()) {
    tried.push_back(*batch);
    if (tried.size() > 64) break;  // a plan that never ends fails the test below, not the run
    plan.record(*batch, *batch > fail_above ? std::nullopt
                                            : std::optional<double>(fraction_per_image * static_cast<double>(*batch)));
  }
  return tried;
}

TEST(Sweep, BatchSearchDoublesThenBisectsToTheFraction) {
  BatchSearch search;  // start 256, factor 2, fraction 0.9, refine 3
  search.max = 1 << 20;
  // 1e-5 of the device per image: 90% is 90,000 images. Doubling passes it at 131072 (131%,
  // still runs); three bisections between 65536 and 131072 on multiples of 256.
  std::vector<int64_t> expected{256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 98304, 81920, 90112};
  EXPECT_EQ(search_batches(search, 1e-5, 1 << 30), expected);
  // Out of memory past 100,000 images ends the growth the same way; the bisections then avoid it.
  EXPECT_EQ(search_batches(search, 1e-5, 100000), expected);
  BatchSearchPlan plan(search);
  for (int64_t batch : expected) plan.record(batch, 1e-5 * static_cast<double>(batch));
  EXPECT_EQ(plan.best(), 81920);

  // The growth stops at max when memory never reaches the fraction; nothing to bisect.
  search.max = 4096;
  EXPECT_EQ(search_batches(search, 1e-9, 1 << 30), (std::vector<int64_t>{256, 512, 1024, 2048, 4096}));
  // A first point that fails ends the search: no multiple of start lies below it.
  EXPECT_EQ(search_batches(search, 1e-5, 100), (std::vector<int64_t>{256}));
  // No refinement asked for: the doubling alone.
  search.max = 1 << 20;
  search.refine = 0;
  EXPECT_EQ(search_batches(search, 1e-5, 1 << 30).back(), 131072);
  // Bisection stops when no multiple of start lies between the two sides: 256 runs at 70%, 512 is past.
  search.refine = 5;
  EXPECT_EQ(search_batches(search, 0.7 / 256, 1 << 30), (std::vector<int64_t>{256, 512}));
}

/// A batch search's measurements, by a stand-in for a GPU on which each image takes 1/1000 of the
/// memory; counts the batches it measured.
SweepHooks fake_gpu(int64_t& measured) {
  SweepHooks hooks;
  hooks.measure = [&measured](const config::LoadedConfig& point) {
    ++measured;
    const auto batch = static_cast<double>(point.config.data.batch_size);
    return std::map<std::string, double>{{"img_per_s", 1000.0 + batch}, {"memory_fraction", 1e-3 * batch}};
  };
  return hooks;
}

/// The batch sizes of the rows of OUT/results.json.
std::vector<int64_t> saved_batches(const fs::path& out) {
  std::vector<int64_t> batches;
  const nlohmann::json saved = nlohmann::json::parse(read_file(out / "results.json"));
  for (const nlohmann::json& row : saved["rows"]) batches.push_back(row["data.batch_size"].get<int64_t>());
  return batches;
}

// A batch search writes its table after every batch; stopped by a signal, it keeps the batches
// measured, marked unfinished, and the same sweep again takes them from there, as a grid sweep
// takes its finished points, and measures only the rest.
TEST(Sweep, ABatchSearchWritesEveryBatchAndGoesOnWhereItWasStopped) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("bench": {"warmup": 0, "steps": 1},
      "batch_search": {"start": 16, "max": 4096, "memory_fraction": 0.5})");
  // Doubling from 16 passes half the memory at 512; three bisections on multiples of 16 between 256 and 512.
  const std::vector<int64_t> batches{16, 32, 64, 128, 256, 512, 384, 448, 480};
  int64_t measured = 0;
  const SweepResult whole = run_sweep(file, dir.path() / "whole", {}, false, fake_gpu(measured));
  EXPECT_TRUE(whole.finished);
  EXPECT_EQ(saved_batches(dir.path() / "whole"), batches);
  EXPECT_EQ(measured, 9);

  const fs::path out = dir.path() / "out";
  measured = 0;
  SweepHooks hooks = fake_gpu(measured);
  std::vector<size_t> rows_written;
  hooks.after_point = [&](int64_t rows) {
    rows_written.push_back(saved_batches(out).size());
    if (rows == 3) std::raise(SIGINT);
  };
  try {
    run_sweep(file, out, {}, false, hooks);
    FAIL() << "the search went on after SIGINT";
  } catch (const Interrupted& stopped) {
    EXPECT_EQ(std::string(stopped.what()),
              "stopped by signal 2 after 3 point(s) of the sweep; their results are in " + out.string() +
                  " (marked unfinished): the same command continues the sweep, reusing them");
  }
  EXPECT_EQ(rows_written, (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(saved_batches(out), (std::vector<int64_t>{16, 32, 64}));
  EXPECT_EQ(nlohmann::json::parse(read_file(out / "results.json"))["finished"], false);
  EXPECT_EQ(read_file(out / "results.md").rfind("**Unfinished**: ", 0), 0u) << read_file(out / "results.md");

  measured = 0;
  const SweepResult resumed = run_sweep(file, out, {}, false, fake_gpu(measured));
  EXPECT_EQ(measured, 6);
  ASSERT_EQ(resumed.points.size(), batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(resumed.points[i].reused, i < 3) << i;
    EXPECT_EQ(resumed.points[i].values, whole.points[i].values) << i;
  }
  EXPECT_EQ(saved_batches(out), batches);
  EXPECT_EQ(nlohmann::json::parse(read_file(out / "results.json"))["finished"], true);
  EXPECT_EQ(read_file(out / "results.md").find("Unfinished"), std::string::npos);
}

TEST(Sweep, BadDescriptionsAndTheCpuBatchSearch) {
  TempDir dir;
  try {
    run_sweep(write_sweep(dir, R"("mode": "bench", "grid": {"data.batch_size": [16]}, "gird": {})"), dir.path());
    FAIL() << "an unknown key was accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("unknown key \"gird\""), std::string::npos) << error.what();
  }
  EXPECT_THROW(run_sweep(write_sweep(dir, R"("mode": "fit", "grid": {"data.batch_size": [16]})"), dir.path()),
               ConfigError);
  EXPECT_THROW(run_sweep(write_sweep(dir, R"("grid": {"data.batch_size": []})"), dir.path()), ConfigError);
  EXPECT_THROW(run_sweep(write_sweep(dir, R"("mode": "train", "batch_search": {})"), dir.path()), ConfigError);
  EXPECT_THROW(run_sweep(write_sweep(dir, R"("batch_search": {"refine": -1})"), dir.path()), ConfigError);

  // On the CPU the search cannot measure memory: refused before anything is written, by --dry-run
  // too, with exit code 2 and the one line.
  const fs::path search = write_sweep(dir, R"("bench": {"warmup": 0, "steps": 1}, "batch_search": {"start": 8, "max": 64})");
  const std::string refusal = search.string() + ": point 0 (data.batch_size=8) cannot run on this machine: "
                                                "batch_search measures each batch's peak memory on a CUDA device, "
                                                "and run.device resolves to cpu here; run the search on a GPU host";
  try {
    run_sweep(search, dir.path() / "search");
    FAIL() << "a batch search ran on the CPU";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), refusal);
  }
  EXPECT_FALSE(fs::exists(dir.path() / "search"));
  for (const std::string dry_run : {"--dry-run ", ""}) {
    EXPECT_EQ(run_ltrain("sweep " + dry_run + "--config " + search.string() + " --out " + (dir.path() / "search").string(),
                         dir.path() / "log"),
              2)
        << read_file(dir.path() / "log");
    EXPECT_EQ(error_line(dir.path() / "log"), refusal);
    EXPECT_FALSE(fs::exists(dir.path() / "search"));
  }

  // Through the command line: a bad file is exit code 2; a sweep with failed points exits 7.
  write_sweep(dir, R"("grid": {"model.checkpoint_segments": [0, 9]}, "bench": {"warmup": 0, "steps": 1})");
  EXPECT_EQ(run_ltrain("sweep --config " + (dir.path() / "sweep.json").string() + " --out " +
                           (dir.path() / "cli").string(),
                       dir.path() / "log"),
            7)
      << read_file(dir.path() / "log");
  EXPECT_NE(read_file(dir.path() / "log").find("2 point(s), 1 failed"), std::string::npos) << read_file(dir.path() / "log");
  EXPECT_EQ(run_ltrain("sweep --config " + (dir.path() / "missing.json").string(), dir.path() / "log"), 2);
}

TEST(Sweep, ARerunReusesTheFinishedPointsAndFreshMeasuresThemAgain) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("bench": {"warmup": 0, "steps": 1, "rounds": 2},
      "zip": {"data.batch_size": [8, 16, 16], "model.checkpoint_segments": [0, 0, 9]})");
  const fs::path out = dir.path() / "out";
  const SweepResult first = run_sweep(file, out);
  ASSERT_EQ(first.points.size(), 3u);
  for (const SweepPoint& point : first.points) EXPECT_FALSE(point.reused);
  // Two rounds: the img/s of their mean time, between the two (not the slower round's).
  const std::map<std::string, double>& rounds = first.points[0].values;
  EXPECT_NEAR(rounds.at("img_per_s"), 2.0 / (1.0 / rounds.at("img_per_s_low") + 1.0 / rounds.at("img_per_s_high")),
              1e-6 * rounds.at("img_per_s"));
  // The same sweep again: the finished points are the earlier rows, the failed one runs again.
  const SweepResult second = run_sweep(file, out);
  ASSERT_EQ(second.points.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(second.points[i].reused) << i;
    EXPECT_EQ(second.points[i].values, first.points[i].values) << i;
  }
  EXPECT_FALSE(second.points[2].reused);
  EXPECT_FALSE(second.points[2].error.empty());
  // Other timed steps are another measurement; so is another point config.
  EXPECT_FALSE(run_sweep(file, out, {"bench.steps=2"}).points[0].reused);
  EXPECT_FALSE(run_sweep(file, out, {"model.width=8"}).points[0].reused);
  // --fresh measures every point again; the command line says how many were reused.
  const auto log = dir.path() / "log";
  EXPECT_EQ(run_ltrain("sweep --config " + file.string() + " --out " + out.string() + " model.width=8", log), 7);
  EXPECT_NE(read_file(log).find("3 point(s), 1 failed, 2 reused from the earlier run (--fresh measures them again)"),
            std::string::npos)
      << read_file(log);
  EXPECT_NE(read_file(log).find("sweep point 0: data.batch_size=8 model.checkpoint_segments=0 | img_per_s "),
            std::string::npos)
      << read_file(log);
  EXPECT_EQ(run_ltrain("sweep --fresh --config " + file.string() + " --out " + out.string() + " model.width=8", log), 7);
  EXPECT_NE(read_file(log).find("3 point(s), 1 failed; results in"), std::string::npos) << read_file(log);
  const nlohmann::json saved = nlohmann::json::parse(read_file(out / "results.json"));
  EXPECT_FALSE(saved["rows"][0].contains("reused"));
  EXPECT_EQ(saved["rows"][0]["point_key"].get<std::string>().size(), 64u);
}

TEST(Sweep, TrainPointsHonourRunOutDirFromTheCommandLine) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("mode": "train", "grid": {"optim.lr": [0.05]})");
  const fs::path runs = dir.path() / "my-runs";
  const SweepResult result = run_sweep(file, dir.path() / "out", {"run.out_dir=" + runs.string()});
  ASSERT_EQ(result.points.size(), 1u);
  EXPECT_TRUE(result.points[0].error.empty()) << result.points[0].error;
  EXPECT_TRUE(fs::exists(runs / "point-000-optim.lr=0.05" / "summary.json"));
  EXPECT_FALSE(fs::exists(dir.path() / "out" / "runs"));
}

TEST(Sweep, BaseAndGridRunAGridWithoutASweepFile) {
  TempDir dir;
  write_sweep(dir, R"("grid": {})");  // base.json
  const std::string base = (dir.path() / "base.json").string();
  const fs::path out = dir.path() / "out";
  const auto log = dir.path() / "log";
  // The keys in the order given, the first varying slowest.
  const std::string grid = " --grid precision.mode=fp32,bf16 --grid data.batch_size=8,16";
  ASSERT_EQ(run_ltrain("sweep --dry-run --base " + base + grid, log), 0) << read_file(log);
  EXPECT_EQ(read_file(log), "--base " + base + " --grid: mode bench, 4 point(s)\n"
                            "  point 0: precision.mode=\"fp32\" data.batch_size=8\n"
                            "  point 1: precision.mode=\"fp32\" data.batch_size=16\n"
                            "  point 2: precision.mode=\"bf16\" data.batch_size=8\n"
                            "  point 3: precision.mode=\"bf16\" data.batch_size=16\n"
                            "every point is a valid config on this machine; nothing was run\n");
  ASSERT_EQ(run_ltrain("sweep --base " + base + grid + " --out " + out.string() + " bench.warmup=0 bench.steps=1 "
                       "bench.rounds=1",
                       log),
            0)
      << read_file(log);
  const nlohmann::json saved = nlohmann::json::parse(read_file(out / "results.json"));
  EXPECT_EQ(saved["keys"], (nlohmann::json{"precision.mode", "data.batch_size"}));
  ASSERT_EQ(saved["rows"].size(), 4u);
  EXPECT_EQ(saved["rows"][1]["precision.mode"], "fp32");
  EXPECT_EQ(saved["rows"][1]["data.batch_size"], 16);
  // The sweep it ran is a file in the results folder, to run again.
  const nlohmann::json sweep = nlohmann::json::parse(read_file(out / "sweep.json"));
  EXPECT_EQ(sweep["grid"]["data.batch_size"], (nlohmann::json{8, 16}));
  EXPECT_EQ(sweep["base"], fs::absolute(base).string());

  // What is refused, with exit code 2 and one line.
  EXPECT_EQ(run_ltrain("sweep --base " + base + " --grid data.batch_size", log), 2);
  EXPECT_EQ(error_line(log), "ltrain sweep: --grid \"data.batch_size\": expected KEY=V1,V2,..., e.g. --grid "
                             "data.batch_size=256,512");
  EXPECT_EQ(run_ltrain("sweep --base " + base + " --grid optim.lrr=0.1,0.2", log), 2);
  EXPECT_EQ(error_line(log), "ltrain sweep: --grid \"optim.lrr=0.1,0.2\": \"optim.lrr\" is not a config key; ltrain "
                             "train --help lists them");
  EXPECT_EQ(run_ltrain("sweep --grid data.batch_size=8,16", log), 2);
  EXPECT_NE(error_line(log).find("--base and --grid go together"), std::string::npos) << read_file(log);
  EXPECT_EQ(run_ltrain("sweep --dry-run --base " + base + " --grid optim.momentum=0.9,2", log), 2);
  EXPECT_EQ(error_line(log), "ltrain sweep --grid: point 1 (optim.momentum=2) is not a valid config: --set "
                             "optim.momentum=2: optim.momentum = 2: expected a number between 0 and 1");
}

TEST(Sweep, FilesFoldersAndGridsThatCannotWorkAreRefusedAtStart) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("grid": {"data.batch_size": [16]}, "bench": {"warmup": 0, "steps": 1})");
  const auto log = dir.path() / "log";
  // A folder given as the sweep file.
  EXPECT_EQ(testing::run_ltrain_within(20, "sweep --config " + dir.path().string(), log), 2);
  EXPECT_NE(read_file(log).find(dir.path().string() + ": is a directory, not a file; give the path of a sweep file"),
            std::string::npos)
      << read_file(log);
  // --out below a file.
  write_file(dir.path() / "file", "x");
  EXPECT_EQ(testing::run_ltrain_within(20, "sweep --config " + file.string() + " --out " + (dir.path() / "file" / "out").string(),
                                       log),
            2);
  EXPECT_NE(read_file(log).find((dir.path() / "file" / "out").string() + ": cannot create this results folder"),
            std::string::npos)
      << read_file(log);
  // A base config that is not there: every point would fail alike, and the sweep used to succeed.
  write_file(dir.path() / "nobase.json", R"({"base": "nope.json", "grid": {"data.batch_size": [16]}})");
  EXPECT_EQ(testing::run_ltrain_within(20, "sweep --config " + (dir.path() / "nobase.json").string() + " --out " +
                                               (dir.path() / "out").string(),
                                       log),
            2);
  EXPECT_NE(read_file(log).find((dir.path() / "nobase.json").string() + ": base = \"nope.json\": " +
                                (dir.path() / "nope.json").string() +
                                ": no such file (paths are relative to the sweep file)"),
            std::string::npos)
      << read_file(log);
  // 40^8 points.
  std::string keys;
  for (const char* key : {"optim.lr", "optim.momentum", "optim.weight_decay", "optim.eps", "loss.label_smoothing",
                          "schedule.gamma", "schedule.pct_start", "data.batch_size"}) {
    std::string values;
    for (int i = 1; i <= 40; ++i) values += (i > 1 ? "," : "") + std::to_string(i);
    keys += fmt::format("{}\"{}\": [{}]", keys.empty() ? "" : ", ", key, values);
  }
  try {
    run_sweep(write_sweep(dir, R"("grid": {)" + keys + "}"), dir.path() / "out");
    FAIL() << "a grid of 40^8 points was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              (dir.path() / "sweep.json").string() +
                  ": grid = {\"optim.lr\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,2...: "
                  "6.554e+12 points (the product of its lists' lengths) are more than 10000; shorten the lists or "
                  "split the sweep");
  }
}

/// The ConfigError message of planning `file`.
std::string plan_error(const fs::path& file, const std::vector<std::string>& overrides = {}) {
  try {
    plan_sweep(file, overrides);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(Sweep, ZipTakesValuesTogetherAndTheGridCrossesThem) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("grid": {"precision.mode": ["fp32", "bf16"]},
      "zip": {"data.batch_size": [8, 16, 32], "schedule.warmup_epochs": [0, 0.5, 0.25]})");
  const SweepPlan plan = plan_sweep(file);
  EXPECT_EQ(plan.mode, "bench");
  const std::vector<std::vector<std::string>> expected{
      {"precision.mode=\"fp32\"", "data.batch_size=8", "schedule.warmup_epochs=0"},
      {"precision.mode=\"fp32\"", "data.batch_size=16", "schedule.warmup_epochs=0.5"},
      {"precision.mode=\"fp32\"", "data.batch_size=32", "schedule.warmup_epochs=0.25"},
      {"precision.mode=\"bf16\"", "data.batch_size=8", "schedule.warmup_epochs=0"},
      {"precision.mode=\"bf16\"", "data.batch_size=16", "schedule.warmup_epochs=0.5"},
      {"precision.mode=\"bf16\"", "data.batch_size=32", "schedule.warmup_epochs=0.25"}};
  EXPECT_EQ(plan.points, expected);
  // A zip alone.
  EXPECT_EQ(plan_sweep(write_sweep(dir, R"("zip": {"data.batch_size": [8, 16], "optim.lr": [0.1, 0.2]})")).points,
            (std::vector<std::vector<std::string>>{{"data.batch_size=8", "optim.lr=0.1"},
                                                   {"data.batch_size=16", "optim.lr=0.2"}}));

  EXPECT_EQ(plan_error(write_sweep(dir, R"("zip": {"data.batch_size": [8, 16, 32], "optim.lr": [0.1, 0.2]})")),
            (dir.path() / "sweep.json").string() +
                ": zip.optim.lr = [0.1,0.2]: expected 3 values, as many as zip.data.batch_size has: zip takes the i-th "
                "value of every list together");
  EXPECT_EQ(plan_error(write_sweep(dir, R"("grid": {"optim.lr": [0.1]}, "zip": {"optim.lr": [0.1, 0.2]})")),
            (dir.path() / "sweep.json").string() +
                ": zip.optim.lr = [0.1,0.2]: optim.lr is in grid too; keep it in one of them");
  EXPECT_EQ(plan_error(write_sweep(dir, R"("zip": {"optim.lr": []})")),
            (dir.path() / "sweep.json").string() + ": zip.optim.lr = []: expected a non-empty list of values");
}

TEST(Sweep, ScaleLrWithSetsEachPointsLrFromTheBaseLrLinearly) {
  TempDir dir;
  // The base config's LR is the default, 0.1, at the reference batch of 16.
  const fs::path file = write_sweep(dir, R"("zip": {"data.batch_size": [8, 16, 32]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 16})");
  EXPECT_EQ(plan_sweep(file).points,
            (std::vector<std::vector<std::string>>{{"data.batch_size=8", "optim.lr=0.05"},
                                                   {"data.batch_size=16", "optim.lr=0.1"},
                                                   {"data.batch_size=32", "optim.lr=0.2"}}));
  // The base LR is the one after the file's "set" and the command line's --set.
  write_sweep(dir, R"("set": ["optim.lr=0.4"], "grid": {"data.batch_size": [32, 64]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 32})");
  EXPECT_EQ(plan_sweep(file).points, (std::vector<std::vector<std::string>>{{"data.batch_size=32", "optim.lr=0.4"},
                                                                            {"data.batch_size=64", "optim.lr=0.8"}}));
  EXPECT_EQ(plan_sweep(file, {"optim.lr=0.2"}).points[1],
            (std::vector<std::string>{"data.batch_size=64", "optim.lr=0.4"}));

  // Each point runs with its LR: the resolved config of a training point says so.
  write_sweep(dir, R"("mode": "train", "set": ["run.max_steps=1", "run.eval_every_epochs=0"],
      "zip": {"data.batch_size": [8, 32]}, "scale_lr_with": {"key": "data.batch_size", "reference": 16})");
  const SweepResult result = run_sweep(file, dir.path() / "out");
  EXPECT_EQ(result.keys, (std::vector<std::string>{"data.batch_size", "optim.lr"}));
  ASSERT_EQ(result.points.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(result.points[i].error.empty()) << result.points[i].error;
    const auto saved = nlohmann::json::parse(read_file(
        dir.path() / "out" / "runs" /
        (i == 0 ? "point-000-data.batch_size=8,optim.lr=0.05" : "point-001-data.batch_size=32,optim.lr=0.2") /
        "config.json"));
    EXPECT_EQ(saved["optim"]["lr"], i == 0 ? 0.05 : 0.2);
    EXPECT_EQ(saved["data"]["batch_size"], i == 0 ? 8 : 32);
  }
  EXPECT_EQ(read_file(dir.path() / "out" / "results.csv").substr(0, 25), "data.batch_size,optim.lr,");
}

TEST(Sweep, ScaleLrWithRefusesAPointThatSetsTheLrAndKeysTheSweepDoesNotVary) {
  TempDir dir;
  const std::string file = (dir.path() / "sweep.json").string();
  EXPECT_EQ(plan_error(write_sweep(dir, R"("zip": {"data.batch_size": [8, 16], "optim.lr": [0.1, 0.2]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 8})")),
            file + ": point 0 (data.batch_size=8 optim.lr=0.1) sets optim.lr itself, which scale_lr_with computes "
                   "from data.batch_size; take optim.lr out of the grid and zip (the base config's LR is the one at "
                   "data.batch_size = 8), or drop scale_lr_with");
  // A whole optim section with an lr in it sets the LR too.
  EXPECT_NE(plan_error(write_sweep(dir, R"("grid": {"data.batch_size": [8], "optim": [{"lr": 0.1}]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 8})"))
                .find(": point 0 (data.batch_size=8 optim={\"lr\":0.1}) sets optim.lr itself"),
            std::string::npos);
  EXPECT_EQ(plan_error(write_sweep(dir, R"("grid": {"precision.mode": ["fp32"]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 8})")),
            file + ": scale_lr_with.key = \"data.batch_size\": not a key of the grid or zip (or data.batch_size "
                   "with batch_search); the LR scales with a value the sweep varies");
  EXPECT_EQ(plan_error(write_sweep(dir, R"("grid": {"data.batch_size": [8]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 0})")),
            file + ": scale_lr_with.reference = 0: expected a number > 0 and <= 1000000000");
  EXPECT_EQ(plan_error(write_sweep(dir, R"("grid": {"data.batch_size": [8]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 8, "rule": "sqrt"})")),
            file + ": unknown key \"scale_lr_with.rule\"; the keys of scale_lr_with are: key, reference");
  EXPECT_EQ(plan_error(write_sweep(dir, R"("grid": {"run.name": ["a"]},
      "scale_lr_with": {"key": "run.name", "reference": 8})")),
            file + ": point 0 (run.name=\"a\"): scale_lr_with needs run.name to be a number > 0");
  // run_sweep refuses it at start, before it writes anything.
  write_sweep(dir, R"("zip": {"data.batch_size": [8], "optim.lr": [0.1]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 8})");
  EXPECT_THROW(run_sweep(file, dir.path() / "out"), ConfigError);
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
}

TEST(Sweep, DryRunListsThePointsAndNamesEveryOneThatIsNoConfigOrCannotRunHere) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("set": ["run.seed=3"], "grid": {"data.batch_size": [8, 16]},
      "scale_lr_with": {"key": "data.batch_size", "reference": 8})");
  const auto log = dir.path() / "log";
  ASSERT_EQ(run_ltrain("sweep --dry-run --config " + file.string() + " --out " + (dir.path() / "out").string() +
                           " model.width=8",
                       log),
            0)
      << read_file(log);
  EXPECT_EQ(read_file(log), file.string() + ": mode bench, base " + (dir.path() / "base.json").string() +
                                ", 2 point(s)\n"
                                "  every point: run.seed=3 model.width=8\n"
                                "  point 0: data.batch_size=8 optim.lr=0.1\n"
                                "  point 1: data.batch_size=16 optim.lr=0.2\n"
                                "every point is a valid config on this machine; nothing was run\n");
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
  // Every point refused, each in a line: configs that are none, and a batch larger than the
  // training set (train --dry-run refuses it too).
  write_sweep(dir, R"("grid": {"data.batch_size": [8, 4096], "optim.momentum": [0.9, 2]})");
  EXPECT_EQ(run_ltrain("sweep --dry-run --config " + file.string(), log), 2);
  const std::string out = read_file(log);
  EXPECT_NE(out.find(file.string() + ": point 1 (data.batch_size=8 optim.momentum=2) is not a valid config: "
                                     "--set optim.momentum=2: optim.momentum = 2: expected a number between 0 and 1\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(file.string() + ": point 2 (data.batch_size=4096 optim.momentum=0.9) is not a valid config: "
                                     "--set data.batch_size=4096: data.batch_size = 4096: larger than the training "
                                     "set (128 images); use a smaller batch\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(file.string() + ": point 3 (data.batch_size=4096 optim.momentum=2) is not a valid config: "),
            std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3) << out;
  // The sweep itself refuses them all alike before it writes anything: exit code 2, not 7.
  EXPECT_EQ(run_ltrain("sweep --config " + file.string() + " --out " + (dir.path() / "out").string(), log), 2);
  const std::string refused = read_file(log);
  EXPECT_EQ(std::count(refused.begin(), refused.end(), '\n'), 3) << refused;
  EXPECT_NE(refused.find(": point 2 (data.batch_size=4096 optim.momentum=0.9) is not a valid config: "),
            std::string::npos)
      << refused;
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
  // A point this machine cannot run is refused as its run would be: fp16 on the CPU.
  write_sweep(dir, R"("grid": {"precision.mode": ["fp32", "fp16"]})");
  EXPECT_EQ(run_ltrain("sweep --dry-run --config " + file.string(), log), 2);
  EXPECT_EQ(error_line(log), file.string() + ": point 1 (precision.mode=\"fp16\") cannot run on this machine: --set "
                                             "precision.mode=\"fp16\": precision.mode = \"fp16\": fp16 autocast needs a "
                                             "CUDA device; on the CPU use \"bf16\" (CPU autocast) or \"fp32\"");
  // Warm-up steps that would time a graphed step's capture fail every point alike: refused at
  // start, before what this machine can run is asked.
  write_sweep(dir, R"("set": ["cuda_graph.train=true"], "bench": {"warmup": 3, "steps": 2},
      "grid": {"data.batch_size": [8, 16]})");
  EXPECT_EQ(run_ltrain("sweep --config " + file.string() + " --out " + (dir.path() / "out").string(), log), 2);
  const std::string warmup = read_file(log);
  EXPECT_NE(warmup.find(file.string() + ": point 0 (data.batch_size=8) is not a valid config: bench.warmup 3 must "
                                        "exceed cuda_graph.warmup_steps (3), so that the capture is not timed\n"),
            std::string::npos)
      << warmup;
  EXPECT_EQ(std::count(warmup.begin(), warmup.end(), '\n'), 2) << warmup;
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
}

TEST(Sweep, MisspeltKeysControlCharactersAndUnknownGridKeysAreRefusedAtStartWithExitCode2) {
  TempDir dir;
  const std::string file = (dir.path() / "sweep.json").string();
  const auto log = dir.path() / "log";
  const auto sweep = [&](const std::string& body, const std::string& arguments = "") {
    write_sweep(dir, body);
    return run_ltrain_within(60, "sweep --config " + file + " --out " + (dir.path() / "out").string() + arguments, log);
  };
  const std::string just_grid = R"("grid": {"data.batch_size": [8]})";
  const std::string grid = just_grid + ", ";
  // A key misspelt inside a section, as in a run config: the closest key.
  EXPECT_EQ(sweep(grid + R"("bench": {"stepss": 5})"), 2);
  EXPECT_EQ(error_line(log), file + ": unknown key \"bench.stepss\": did you mean \"bench.steps\"?");
  // A control character in a string, written raw or escaped.
  const std::string control = ": a control character (\\u0001) cannot be part of a setting; remove it";
  EXPECT_EQ(sweep(grid + "\"set\": [\"run.name=a\x01" "b\"]"), 2);
  EXPECT_EQ(error_line(log), file + ": set[0] = \"run.name=a\\u0001b\"" + control);
  EXPECT_EQ(sweep(grid + R"("set": ["run.name=a\u0001b"])"), 2);
  EXPECT_EQ(error_line(log), file + ": set[0] = \"run.name=a\\u0001b\"" + control);
  // A grid or zip key is a run config key: the closest, or what they take.
  EXPECT_EQ(sweep(R"("grid": {"optim.lrr": [0.1, 0.2]})"), 2);
  EXPECT_EQ(error_line(log), file + ": unknown key \"grid.optim.lrr\": did you mean \"grid.optim.lr\"?");
  EXPECT_EQ(sweep(R"("zip": {"colour.depth": [8]})"), 2);
  EXPECT_EQ(error_line(log), file + ": unknown key \"zip.colour.depth\": zip takes run config keys (section.key) or "
                                    "sections; ltrain train --help lists them");
  // Types and limits, in run configs' words.
  EXPECT_EQ(sweep(grid + R"("bench": {"steps": 0})"), 2);
  EXPECT_EQ(error_line(log), file + ": bench.steps = 0: expected an integer between 1 and 1000000");
  EXPECT_EQ(sweep(grid + R"("mode": "fit")"), 2);
  EXPECT_EQ(error_line(log), file + ": mode = \"fit\": expected one of bench, train");
  EXPECT_EQ(sweep(R"("batch_search": {"start": 512, "max": 256})"), 2);
  EXPECT_EQ(error_line(log), file + ": batch_search.max = 256: expected at least batch_search.start (512)");
  // "set" holds run config overrides: each is checked as one.
  EXPECT_EQ(sweep(grid + R"("set": ["run.seed=1", "optim.lrr=0.1"])"), 2);
  EXPECT_EQ(error_line(log), file + ": set[1]: unknown key \"optim.lrr\": did you mean \"optim.lr\"?");
  EXPECT_EQ(sweep(grid + R"("set": ["optim.lr=fast"])"), 2);
  EXPECT_EQ(error_line(log), file + ": set[0]: optim.lr = \"fast\": expected a number > 0 and <= 1000");
  // The command line's overrides: of a sweep key, or of every point's run config.
  EXPECT_EQ(sweep(just_grid, " bench.steps=0"), 2);
  EXPECT_EQ(error_line(log), "--set bench.steps=0: bench.steps = 0: expected an integer between 1 and 1000000");
  EXPECT_EQ(sweep(just_grid, " --set optim.lrr=0.1"), 2);
  EXPECT_EQ(error_line(log), "--set optim.lrr=0.1: unknown key \"optim.lrr\": did you mean \"optim.lr\"?");
  EXPECT_EQ(sweep(just_grid, " bench.stepss=5"), 2);
  EXPECT_EQ(error_line(log), "ltrain sweep: argument \"bench.stepss=5\": \"bench.stepss\" is not a config key or sweep "
                             "key; ltrain sweep --help lists them");
  EXPECT_FALSE(fs::exists(dir.path() / "out"));  // refused before anything ran
}

TEST(Sweep, OverridesOfSweepKeysChangeTheFileAndTheOthersEveryPoint) {
  TempDir dir;
  const fs::path file = write_sweep(dir, R"("grid": {"data.batch_size": [8, 16]})");
  const SweepPlan plan = plan_sweep(file, {"mode=train", "model.width=8", R"(bench={"steps":2})", "zip={\"run.seed\":[1,2]}"});
  EXPECT_EQ(plan.mode, "train");
  EXPECT_EQ(plan.overrides, (std::vector<std::string>{"model.width=8"}));
  EXPECT_EQ(plan.points.size(), 4u);
  EXPECT_EQ(plan.points[1], (std::vector<std::string>{"data.batch_size=8", "run.seed=2"}));
  // A key of the top level is replaced, not merged: the grid is the override's alone.
  EXPECT_EQ(plan_sweep(file, {R"(grid={"optim.lr":[0.1]})"}).points,
            (std::vector<std::vector<std::string>>{{"optim.lr=0.1"}}));
  EXPECT_EQ(plan_error(file, {R"(grid={"optim.lrr":[0.1]})"}),
            R"(--set grid={"optim.lrr":[0.1]}: unknown key "grid.optim.lrr": did you mean "grid.optim.lr"?)");
}

TEST(Sweep, SchemaAndHelpDescribeEverySweepKey) {
  TempDir dir;
  const auto out = dir.path() / "out";
  ASSERT_EQ(run_ltrain("sweep --schema", out), 0) << read_file(out);
  const auto schema = nlohmann::ordered_json::parse(read_file(out));
  EXPECT_EQ(schema, config::sweep_schema());
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  for (const config::KeyInfo& key : config::sweep_keys().keys) {
    const auto dot = key.name.find('.');
    const auto& described = dot == std::string::npos
                                ? schema["properties"][key.name]
                                : schema["properties"][key.name.substr(0, dot)]["properties"][key.name.substr(dot + 1)];
    EXPECT_EQ(described["description"], key.description) << key.name;
  }
  ASSERT_EQ(run_ltrain("sweep --help", out), 0);
  const std::string help = read_file(out);
  for (const config::KeyInfo& key : config::sweep_keys().keys)
    EXPECT_NE(help.find("\n  " + key.name + " "), std::string::npos) << key.name << "\n" << help;
}

TEST(Sweep, CompletionOffersTheSweepKeysToLtrainSweep) {
  TempDir dir;
  const auto script = dir.path() / "ltrain.bash";
  ASSERT_EQ(run_ltrain("completion bash", script), 0) << read_file(script);
  const std::string bash = read_file(script);
  const auto keys_at = bash.find("\n_ltrain_sweep_keys='");
  ASSERT_NE(keys_at, std::string::npos);
  const std::string keys = " " + bash.substr(keys_at + 21, bash.find('\'', keys_at + 21) - keys_at - 21) + " ";
  for (const config::KeyInfo& key : config::sweep_keys().keys)
    EXPECT_NE(keys.find(" " + key.name + " "), std::string::npos) << key.name;
  // What bash offers for a command line (the cursor at its end).
  const auto offered = [&](const std::string& line) {
    write_file(dir.path() / "driver.bash", "source '" + script.string() + "'\nCOMP_LINE='" + line +
                                               "'\nCOMP_POINT=${#COMP_LINE}\n_ltrain\necho \"${COMPREPLY[*]}\"\n");
    const auto words = dir.path() / "words";
    EXPECT_EQ(std::system(("bash " + (dir.path() / "driver.bash").string() + " > " + words.string() + " 2>&1").c_str()),
              0);
    std::string text = read_file(words);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  };
  EXPECT_EQ(offered("ltrain sweep --config s.json bench.st"), "bench.steps=");
  EXPECT_EQ(offered("ltrain sweep --set batch_search.m"), "batch_search.memory_fraction= batch_search.max=");
  EXPECT_EQ(offered("ltrain sweep mode="), "bench train");
  EXPECT_EQ(offered("ltrain sweep optim.l"), "optim.lr=");      // every point's run config keys too
  EXPECT_EQ(offered("ltrain train --set bench.st"), "");        // train takes run config keys only

  const auto zsh_script = dir.path() / "_ltrain";
  ASSERT_EQ(run_ltrain("completion zsh", zsh_script), 0) << read_file(zsh_script);
  const std::string zsh = read_file(zsh_script);
  for (const config::KeyInfo& key : config::sweep_keys().keys)
    EXPECT_NE(zsh.find("'" + key.name + ":"), std::string::npos) << key.name;
  if (std::system("command -v zsh > /dev/null 2>&1") == 0) {
    EXPECT_EQ(std::system(("zsh -n " + zsh_script.string()).c_str()), 0);
  }
}

TEST(Sweep, TheBatchLrScalingExampleScalesTheRecipesLr) {
  const fs::path file = fs::path(LTRAIN_SOURCE_DIR) / "configs" / "sweeps" / "batch-lr-scaling.json";
  const SweepPlan plan = plan_sweep(file);
  EXPECT_EQ(plan.mode, "train");
  ASSERT_EQ(plan.points.size(), 8u);
  // The recipe's LR, 0.4 at batch 512, scaled with the batch; two seeds of each.
  const std::vector<std::string> lrs{"optim.lr=0.2", "optim.lr=0.4", "optim.lr=0.8", "optim.lr=1.6"};
  for (size_t i = 0; i < plan.points.size(); ++i) EXPECT_EQ(plan.points[i].back(), lrs[i % 4]) << i;
}

}  // namespace
}  // namespace ltrain::bench
