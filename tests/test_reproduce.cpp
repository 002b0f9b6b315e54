// ltrain reproduce: the verdict from rounds of A/B measurements, the published card figures, and a
// run reduced to a tiny model on the CPU in which every claim gets a row with its guide and line,
// measured where the CPU can measure it and "not measurable here" with the reason elsewhere.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <thread>

#include "ltrain/bench/reproduce.h"
#include "support.h"

namespace ltrain::bench {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;

TEST(ReproduceVerdict, RatiosArePairedByRoundWithTheirMedianAndRange) {
  const RatioSpread spread = ratio_spread({100, 200, 100}, {250, 500, 300});  // 2.5, 2.5, 3.0
  EXPECT_DOUBLE_EQ(spread.median, 2.5);
  EXPECT_DOUBLE_EQ(spread.low, 2.5);
  EXPECT_DOUBLE_EQ(spread.high, 3.0);
  EXPECT_EQ(spread.rounds, 3);
  const RatioSpread even = ratio_spread({1, 1, 1, 1}, {1.0, 1.2, 1.4, 2.0});
  EXPECT_DOUBLE_EQ(even.median, 1.3);
  EXPECT_EQ(ratio_spread({}, {}).rounds, 0);
}

TEST(ReproduceVerdict, HoldsOnlyWhenEveryRoundMeetsTheClaimAndFailsOnlyWhenNoneDoes) {
  // A speed-up of at least 2x, measured 1.9-2.2x: the claim lies within the spread.
  const RatioSpread mixed = ratio_spread({10, 10, 10}, {19, 21, 22});
  EXPECT_EQ(verdict(mixed, 2.0, Comparison::at_least), "undecided: the claimed 2.00x lies within the rounds' 1.90-2.20x");
  EXPECT_EQ(verdict(mixed, 1.9, Comparison::at_least), "holds");
  EXPECT_EQ(verdict(mixed, 2.21, Comparison::at_least), "does not hold");
  // A saving of at least 30% (ratio at most 0.70), measured 0.52-0.55: holds; measured 0.88: does not.
  EXPECT_EQ(verdict(ratio_spread({100, 100}, {52, 55}), 0.70, Comparison::at_most), "holds");
  EXPECT_EQ(verdict(ratio_spread({100, 100}, {88, 88}), 0.70, Comparison::at_most), "does not hold");
  EXPECT_EQ(verdict(ratio_spread({100, 100}, {65, 75}), 0.70, Comparison::at_most),
            "undecided: the claimed 0.70x lies within the rounds' 0.65-0.75x");
  // One round has no spread: its ratio decides.
  EXPECT_EQ(verdict(ratio_spread({10}, {15}), 1.5, Comparison::at_least), "holds");
}

TEST(ReproduceVerdict, ADifferenceSmallerThanTheRoundsSpreadIsNoise) {
  // A: 100 and 120 img/s (a 20% range around 110); B: 104 and 106.
  const double noise = rounds_noise({100, 120}, {104, 106});
  EXPECT_NEAR(noise, 20.0 / 110.0, 1e-12);
  EXPECT_TRUE(within_noise(0.95, 1.0, noise));
  EXPECT_TRUE(within_noise(1.15, 1.0, noise));
  EXPECT_FALSE(within_noise(0.30, 1.0, noise));  // 70% faster: more than the rounds vary
  EXPECT_TRUE(within_noise(2.2, 2.0, noise));    // relative to the claimed ratio
  // One round a side measures no spread: no difference is noise then.
  EXPECT_EQ(rounds_noise({100}, {30}), 0.0);
  EXPECT_FALSE(within_noise(1.01, 1.0, 0.0));
}

TEST(ReproduceCards, PublishedFiguresByTheDriversName) {
  const PublishedCard* d = published_card("NVIDIA GeForce RTX 4090 D");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->multiprocessors, 114);
  EXPECT_EQ(d->cuda_cores, 14592);
  const PublishedCard* full = published_card("NVIDIA GeForce RTX 4090");
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(full->cuda_cores, 16384);
  const PublishedCard* blackwell = published_card("NVIDIA GeForce RTX 5090");
  ASSERT_NE(blackwell, nullptr);
  EXPECT_EQ(blackwell->architecture, "Blackwell");
  EXPECT_EQ(blackwell->memory, "32 GB GDDR7");
  EXPECT_EQ(published_card("NVIDIA H200")->multiprocessors, 132);
  EXPECT_EQ(published_card("NVIDIA A10"), nullptr);
}

TEST(Reproduce, ReducedRunOnTheCpuWritesEveryClaimWithItsGuide) {
  TempDir dir;
  testing::write_file(dir.path() / "base.json", R"({"run": {"device": "cpu", "threads": 1},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 8},
    "data": {"source": "synthetic", "synthetic_train_size": 128, "synthetic_test_size": 32, "batch_size": 16}})");
  ReproduceOptions options;
  options.base_config = dir.path() / "base.json";
  options.warmup = 1;
  options.steps = 2;
  options.rounds = 2;
  options.image_sizes = {32, 40};
  options.matmul_size = 64;
  options.matmul_products = 2;
  const ReproduceReport report = reproduce(options, dir.path() / "report");
  // 12 step claims at each of 2 sizes, 4 matmul precisions, the batch search, 6 card statements.
  ASSERT_EQ(report.rows.size(), 2u * 12u + 4u + 1u + 6u);
  auto row = [&](const std::string& start, const std::string& guide, int64_t size = 32) {
    for (const ClaimRow& r : report.rows)
      if (r.claim.rfind(start, 0) == 0 && r.guide == guide && (r.image_size == size || r.image_size == 0)) return r;
    ADD_FAILURE() << "no claim starting " << start << " by " << guide;
    return ClaimRow{};
  };
  for (const ClaimRow& r : report.rows) {
    EXPECT_FALSE(r.verdict.empty()) << r.claim;
    if (r.guide != "none") {
      EXPECT_FALSE(r.quote.empty()) << r.claim;
    }
  }
  const ClaimRow amp = row("AMP (fp16", "RTX 4090 guide");
  EXPECT_EQ(amp.quote, "效果：ResNet50 训练速度提升 2 - 3 倍，显存占用减少 30%");
  EXPECT_NE(amp.verdict.find("not measurable here: "), std::string::npos);
  EXPECT_NE(amp.verdict.find("fp16 autocast needs a CUDA device"), std::string::npos);
  EXPECT_NE(row("FP16 and TF32", "RTX 5090 guide").verdict.find("fp16 autocast needs a CUDA device"), std::string::npos);
  EXPECT_NE(row("TF32", "RTX 4090D guide").verdict.find("TF32 is a feature of NVIDIA GPUs"), std::string::npos);
  // The CPU times accumulation and checkpointing (in the base's fp32) but cannot measure their memory.
  for (const std::string guide : {"RTX 5090 guide", "RTX 4090 guide"}) {
    const ClaimRow accumulation = row("accumulating 4 batches", guide, 40);
    EXPECT_NE(accumulation.claim.find("(16 images)"), std::string::npos) << accumulation.claim;
    EXPECT_NE(accumulation.measured.find("time per image"), std::string::npos) << accumulation.measured;
    EXPECT_EQ(accumulation.verdict, "not measurable here: peak memory is measured on CUDA devices");
  }
  // channels_last is measured over both rounds and given no verdict.
  const ClaimRow channels_last = row("channels_last memory format under fp32", "none");
  EXPECT_EQ(channels_last.verdict, "measured");
  EXPECT_EQ(channels_last.ratio.rounds, 2);
  EXPECT_LE(channels_last.ratio.low, channels_last.ratio.median);
  EXPECT_LE(channels_last.ratio.median, channels_last.ratio.high);
  EXPECT_EQ(row("matmul TFLOPS test (n = 64, 2 timed products), fp32", "RTX 4090 guide").verdict, "measured");
  // Where LibTorch has no fp16 product on the CPU, the row says so in ltrain's words.
  const std::string fp16_matmul = row("matmul TFLOPS test (n = 64, 2 timed products), fp16", "RTX 4090 guide").verdict;
  if (fp16_matmul != "measured") {
    EXPECT_NE(fp16_matmul.find("has no fp16 kernel for this operation on the CPU; fp16 is measured on a CUDA device"),
              std::string::npos)
        << fp16_matmul;
  }
  for (const ClaimRow& r : report.rows) EXPECT_EQ(r.verdict.find("not implemented for"), std::string::npos) << r.verdict;
  EXPECT_EQ(row("matmul TFLOPS test (n = 64, 2 timed products), tf32", "RTX 4090 guide").verdict,
            "not measurable here: TF32 is a feature of NVIDIA GPUs");
  EXPECT_EQ(row("grow the batch", "RTX 4090D guide").verdict, "not measurable here: the search measures GPU memory");
  EXPECT_EQ(row("the RTX 4090D has 16,384 CUDA cores", "RTX 4090D guide").verdict,
            "wrong: those are the RTX 4090's; published: NVIDIA GeForce RTX 4090 D (Ada Lovelace, compute capability "
            "8.9, 114 SMs, 14,592 CUDA cores, 24 GB GDDR6X at 1,008 GB/s)");
  EXPECT_EQ(row("the RTX 5090 is an Ada Lovelace card", "RTX 5090 guide").measured, "this device: " + report.device);

  const std::string text = write_report(report, dir.path() / "report");
  EXPECT_EQ(read_file(dir.path() / "report" / "REPORT.md"), text);
  for (const std::string expected :
       {"| claim | guide and line | measured here | ratio | verdict |", "## Training steps at 32x32",
        "## Training steps at 40x40", "## The matmul test, the batch search and the cards",
        "- **RTX 5090 guide**: RTX 5090跑深度学习：新手入门指南与性能调优实战",
        "Model: resnet18 (cifar stem, 10 classes, channels_last off)", "measured at 32x32, 40x40",
        "Batch 16, sgd with lr 0.1", "the others run under fp32", "2 round(s) of A then B per claim",
        "| RTX 5090 guide: “同时使用 FP16 和 TF32 计算，吞吐量可提升 3 倍” |",
        // Where the numbers come from.
        "- ltrain " LTRAIN_VERSION ", commit ", "- Image sizes: 32x32, 40x40\n", "- GPUs: ", "- Host "})
    EXPECT_NE(text.find(expected), std::string::npos) << expected;
  const std::string base_line =
      "- Base config: `" + (dir.path() / "base.json").string() + "`; SHA-256 of the resolved config: `";
  EXPECT_NE(text.find(base_line), std::string::npos)
      << text;
  const nlohmann::json saved = nlohmann::json::parse(read_file(dir.path() / "report" / "results.json"));
  EXPECT_EQ(saved["claims"].size(), report.rows.size());
  EXPECT_EQ(saved["finished"], true);
  EXPECT_EQ(text.find("Unfinished"), std::string::npos);
  EXPECT_EQ(saved["provenance"]["config_files"], nlohmann::json{(dir.path() / "base.json").string()});
  EXPECT_EQ(saved["provenance"]["config_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(saved["image_sizes"], (nlohmann::json{32, 40}));
  EXPECT_EQ(saved["measurements"]["steps"]["32"]["fp32 NCHW"]["rounds"].size(), 2u);
  EXPECT_EQ(saved["measurements"]["steps"]["40"]["fp32 channels_last"]["rounds"].size(), 2u);
  EXPECT_EQ(saved["measurements"]["steps"]["40"]["4 segments"]["rounds"][1]["checkpoint_segments"], 4);
  EXPECT_EQ(saved["measurements"]["steps"]["40"]["fp16"]["error"].get<std::string>().find("--set precision.mode=fp16"),
            0u);
  EXPECT_EQ(saved["measurements"]["matmul"].size(), 4u);

  // The report's plot.
  LTRAIN_REQUIRE_PYTHON(python, "matplotlib");
  ASSERT_EQ(testing::run_plot_script(python, "plot_report.py", (dir.path() / "report").string(), dir.path() / "plot"), 0)
      << read_file(dir.path() / "plot");
  EXPECT_EQ(read_file(dir.path() / "report" / "claims.png").substr(1, 3), "PNG");
}

/// results.json of a report folder, or null while it is missing or being replaced.
nlohmann::json saved_results(const fs::path& dir) {
  try {
    return nlohmann::json::parse(read_file(dir / "results.json"));
  } catch (const std::exception&) {
    return nullptr;
  }
}

TEST(Reproduce, AnInterruptedRunKeepsItsMeasurementsAndTheNextContinuesThem) {
  TempDir dir;
  testing::write_file(dir.path() / "base.json", R"({"run": {"device": "cpu", "threads": 1},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 8},
    "data": {"source": "synthetic", "synthetic_train_size": 64, "synthetic_test_size": 16, "batch_size": 16}})");
  const fs::path report = dir.path() / "report";
  const std::vector<std::string> args{"reproduce",     "--config", (dir.path() / "base.json").string(),
                                      "--out",         report.string(), "--warmup", "1", "--steps", "1",
                                      "--rounds",      "2", "--matmul-size", "32", "--matmul-iters", "1"};
  {
    testing::LtrainProcess process(args);
    // Stopped once it has measured a few rounds.
    for (int i = 0; i < 1200; ++i) {
      const nlohmann::json saved = saved_results(report);
      if (saved.is_object() && saved["measurements"]["steps"].dump().find("\"rounds\"") != std::string::npos &&
          saved["measurements"]["steps"]["32"].size() >= 2)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(process.pid(), SIGINT);
    ASSERT_EQ(process.wait(60), 130) << process.output();
  }
  const nlohmann::json cut_short = saved_results(report);
  ASSERT_TRUE(cut_short.is_object());
  EXPECT_EQ(cut_short["finished"], false);
  EXPECT_EQ(read_file(report / "REPORT.md").find("# The guides' claims, measured\n\n**Unfinished**"), 0u);
  const size_t measured = cut_short["measurements"]["steps"]["32"].size();
  EXPECT_GE(measured, 2u);

  // Other settings would replace it: refused, the report kept.
  std::vector<std::string> other = args;
  other[8] = "2";  // --steps 2
  std::string words;
  for (const std::string& word : other) words += " '" + word + "'";
  EXPECT_EQ(testing::run_ltrain(words.substr(1), dir.path() / "log"), 2);
  EXPECT_NE(read_file(dir.path() / "log").find(report.string() + " holds an unfinished report of other settings (steps 1 "
                                                                 "before, 2 now); rerun with those settings to continue "
                                                                 "it, add --fresh to replace it, or choose another --out"),
            std::string::npos)
      << read_file(dir.path() / "log");
  EXPECT_EQ(saved_results(report)["finished"], false);

  // The same command continues it, saying what it reused, and finishes it.
  words.clear();
  for (const std::string& word : args) words += " '" + word + "'";
  ASSERT_EQ(testing::run_ltrain(words.substr(1), dir.path() / "log"), 0) << read_file(dir.path() / "log");
  EXPECT_NE(read_file(dir.path() / "log").find(report.string() + ": continuing the unfinished report of these "
                                                                 "settings; reused "),
            std::string::npos)
      << read_file(dir.path() / "log");
  const nlohmann::json finished = saved_results(report);
  EXPECT_EQ(finished["finished"], true);
  EXPECT_GE(finished["reused"].size(), measured);
  EXPECT_NE(finished["reused"][0].get<std::string>().find(" at 32x32 ("), std::string::npos) << finished["reused"];
}

TEST(Reproduce, CommandLineErrorsExitWithTwo) {
  TempDir dir;
  EXPECT_EQ(testing::run_ltrain("reproduce --config " + (dir.path() / "none.json").string(), dir.path() / "log"), 2);
  testing::write_file(dir.path() / "base.json", R"({"run": {"device": "cpu"}})");
  for (const std::string sizes : {"32,", "7", "32,abc", "513", ""}) {
    EXPECT_EQ(testing::run_ltrain("reproduce --config " + (dir.path() / "base.json").string() + " --image-sizes '" +
                                      sizes + "'",
                                  dir.path() / "log"),
              2)
        << sizes;
    EXPECT_NE(read_file(dir.path() / "log").find("--image-sizes \"" + sizes + "\": expected sides from 8 to 512"),
              std::string::npos)
        << read_file(dir.path() / "log");
  }
  EXPECT_EQ(testing::run_ltrain("reproduce --config " + (dir.path() / "base.json").string() + " --rounds 0",
                                dir.path() / "log"),
            2);
}

}  // namespace
}  // namespace ltrain::bench
