// ltrain reproduce: the verdict from rounds of A/B measurements, the published card figures, the
// claims files (the one ltrain carries, and bad ones refused in one line), the verdict a claim's
// threshold gives on given numbers, and a run reduced to a tiny model on the CPU in which every
// claim gets a row with its guide and line, measured where the CPU can measure it and "not
// measurable here" with the reason elsewhere.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <thread>

#include "ltrain/bench/claim_runner.h"
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

TEST(ReproduceClaims, EveryShippedClaimLoadsAndTheBuiltInCopyIsTheFile) {
  const ClaimCatalogue& shipped = shipped_claims();
  EXPECT_EQ(shipped.source, "configs/claims/guides.json");
  ASSERT_EQ(shipped.guides.size(), 3u);
  EXPECT_EQ(shipped.guides[0].name, "RTX 5090 guide");
  EXPECT_EQ(shipped.guides[2].title, "NVIDIA 4090D算力实战指南：从环境搭建到深度学习模型部署");
  // 12 A/B step claims, the matmul test, the batch search, 5 statements about cards, 1 unmeasurable.
  std::map<ClaimKind, int> kinds;
  for (const Claim& claim : shipped.claims) ++kinds[claim.kind];
  EXPECT_EQ(kinds[ClaimKind::speed], 7);
  EXPECT_EQ(kinds[ClaimKind::memory], 5);
  EXPECT_EQ(kinds[ClaimKind::matmul], 1);
  EXPECT_EQ(kinds[ClaimKind::batch_search], 1);
  EXPECT_EQ(kinds[ClaimKind::card], 5);
  EXPECT_EQ(kinds[ClaimKind::unmeasurable], 1);
  const Claim& amp = shipped.claims.front();
  EXPECT_EQ(amp.guide, "RTX 4090 guide");
  EXPECT_EQ(amp.quote, "效果：ResNet50 训练速度提升 2 - 3 倍，显存占用减少 30%");
  EXPECT_EQ(amp.a, "fp32");
  EXPECT_EQ(amp.b, "fp16");
  EXPECT_DOUBLE_EQ(amp.threshold, 2.0);
  // Every variant an A/B claim compares exists and fills; so do the claims' texts.
  const StepValues values{"fp16", 256};
  for (const Claim& claim : shipped.claims) {
    if (claim.kind != ClaimKind::speed && claim.kind != ClaimKind::memory) continue;
    for (const std::string& name : {claim.a, claim.b}) {
      ASSERT_TRUE(shipped.variants.count(name)) << name;
      for (const std::string& setting : fill_variant(shipped.variants.at(name), values).settings)
        EXPECT_EQ(setting.find('{'), std::string::npos) << setting;
    }
    EXPECT_EQ(fill_placeholders(claim.text, step_placeholders(values)).find('{'), std::string::npos) << claim.text;
  }
  const Variant split = fill_variant(shipped.variants.at("{micro_batches} x {micro_batch} accumulated"), values);
  EXPECT_EQ(split.name, "4 x 64 accumulated");
  EXPECT_EQ(split.settings.back(), "optim.accumulation_steps=4");
  // The copy built into ltrain is the file in the source folder.
  const ClaimCatalogue file = load_claims(fs::path(LTRAIN_SOURCE_DIR) / "configs/claims/guides.json");
  ASSERT_EQ(file.claims.size(), shipped.claims.size());
  for (size_t i = 0; i < file.claims.size(); ++i) {
    EXPECT_EQ(file.claims[i].text, shipped.claims[i].text);
    EXPECT_EQ(file.claims[i].quote, shipped.claims[i].quote);
  }
}

/// A claims document of one guide, two variants and one speed claim, for the tests to break.
nlohmann::json small_claims() {
  return nlohmann::json::parse(R"({
    "guides": [{"name": "G", "title": "指南", "about": "a guide"}],
    "variants": {"fp32": ["precision.mode=fp32"], "{mode} NCHW": ["precision.mode={mode}", "model.channels_last=false"]},
    "claims": [{"guide": "G", "claim": "it is faster", "quote": "更快", "kind": "speed", "a": "fp32",
                "b": "{mode} NCHW", "at_least": 2.0}]})");
}

/// parse_claims' ConfigError for `document`, "" when it reads.
std::string claims_error(const nlohmann::json& document) {
  try {
    parse_claims(document.dump(), "my-claims.json");
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(ReproduceClaims, ABadClaimsFileIsOneLineNamingTheFileAndTheKey) {
  EXPECT_EQ(claims_error(small_claims()), "");
  nlohmann::json missing = small_claims();
  missing["claims"][0].erase("quote");
  EXPECT_EQ(claims_error(missing), "my-claims.json: claims[0].quote: missing; expected the guide's line that says it, "
                                   "a string (\"\" for a row of ltrain's own)");
  nlohmann::json wrong_type = small_claims();
  wrong_type["claims"][0]["at_least"] = "2";
  EXPECT_EQ(claims_error(wrong_type), "my-claims.json: claims[0].at_least = \"2\": expected the ratio B / A of images/s "
                                      "the claim needs, a number > 0 (none: measured only)");
  nlohmann::json unknown_setting = small_claims();
  unknown_setting["variants"]["fp32"][0] = "precision.modee=fp32";
  EXPECT_EQ(claims_error(unknown_setting), "my-claims.json: variants.\"fp32\"[0] = \"precision.modee=fp32\": unknown "
                                           "key \"precision.modee\": did you mean \"precision.mode\"?");
  nlohmann::json bad_value = small_claims();
  bad_value["variants"]["fp32"][0] = "precision.mode=fp64";
  EXPECT_EQ(claims_error(bad_value), "my-claims.json: variants.\"fp32\"[0] = \"precision.mode=fp64\": precision.mode = "
                                     "\"fp64\": expected one of fp32, tf32, fp16, bf16");
  nlohmann::json twice = small_claims();
  twice["variants"]["fp32"] = {"precision.mode=fp32", "model.channels_last=false", "precision.mode=fp16"};
  EXPECT_EQ(claims_error(twice), "my-claims.json: variants.\"fp32\"[2] = \"precision.mode=fp16\": sets "
                                 "precision.mode again (variants.\"fp32\"[0] sets it); a variant sets each key once");
  nlohmann::json unknown_variant = small_claims();
  unknown_variant["claims"][0]["a"] = "fp33";
  EXPECT_EQ(claims_error(unknown_variant),
            "my-claims.json: claims[0].a = \"fp33\": no such variant; did you mean \"fp32\"?");
  nlohmann::json unknown_guide = small_claims();
  unknown_guide["claims"][0]["guide"] = "H";
  EXPECT_EQ(claims_error(unknown_guide),
            "my-claims.json: claims[0].guide = \"H\": expected one of the guides' names (G, none)");
  nlohmann::json unknown_key = small_claims();
  unknown_key["claims"][0]["at_leest"] = 2.0;
  EXPECT_EQ(claims_error(unknown_key),
            "my-claims.json: unknown key \"claims[0].at_leest\": did you mean \"claims[0].at_least\"?");
  nlohmann::json unknown_kind = small_claims();
  unknown_kind["claims"][0]["kind"] = "sped";
  EXPECT_EQ(claims_error(unknown_kind), "my-claims.json: claims[0].kind = \"sped\": expected one of speed, memory, "
                                        "matmul, batch_search, card, unmeasurable");
  nlohmann::json unknown_placeholder = small_claims();
  unknown_placeholder["claims"][0]["claim"] = "it is faster at {size}";
  EXPECT_EQ(claims_error(unknown_placeholder),
            "my-claims.json: claims[0].claim = \"it is faster at {size}\": unknown placeholder \"{size}\"; this text "
            "takes {batch}, {micro_batch}, {micro_batches}, {mode}");
  nlohmann::json unknown_card = small_claims();
  unknown_card["claims"][0] = {{"guide", "G"}, {"claim", "c"}, {"quote", "q"}, {"kind", "card"},
                               {"card", "NVIDIA GeForce RTX 2080"}, {"wrong", "w"}};
  EXPECT_NE(claims_error(unknown_card).find("my-claims.json: claims[0].card = \"NVIDIA GeForce RTX 2080\": expected a "
                                            "card whose published figures ltrain knows: NVIDIA GeForce RTX 5090, "),
            std::string::npos)
      << claims_error(unknown_card);
  // Not JSON, and no file at all.
  try {
    parse_claims("{\"guides\": [", "my-claims.json");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("my-claims.json: ", 0), 0u) << error.what();
  }
  TempDir dir;
  try {
    load_claims(dir.path());
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()).find(dir.path().string() + ": "), 0u) << error.what();
    EXPECT_NE(std::string(error.what()).find("--claims names a JSON file of claims as configs/claims/guides.json"),
              std::string::npos)
        << error.what();
  }
}

TEST(ReproduceClaims, TheThresholdGivesTheVerdictOnGivenNumbers) {
  Claim speed;
  speed.kind = ClaimKind::speed;
  speed.threshold = 2.0;
  const SideRounds fp32{"fp32", {100, 100, 100}, {-1, -1, -1}};
  // B at 2.5-2.6x A in every round: holds; at 1.5x: does not; 1.9-2.2x: undecided.
  EXPECT_EQ(judge_step_claim(speed, {}, fp32, {"fp16", {250, 260, 255}, {-1, -1, -1}}).verdict, "holds");
  const ClaimRow slower = judge_step_claim(speed, {}, fp32, {"fp16", {150, 150, 150}, {-1, -1, -1}});
  EXPECT_EQ(slower.verdict, "does not hold");
  EXPECT_DOUBLE_EQ(slower.ratio.median, 1.5);
  EXPECT_DOUBLE_EQ(slower.claimed, 2.0);
  EXPECT_EQ(slower.measured, "fp16: 150 img/s (150-150), fp32: 100 img/s (100-100)");
  EXPECT_EQ(judge_step_claim(speed, {}, fp32, {"fp16", {190, 220, 210}, {-1, -1, -1}}).verdict,
            "undecided: the claimed 2.00x lies within the rounds' 1.90-2.20x");
  // Without a threshold: measured only.
  speed.threshold = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(judge_step_claim(speed, {}, fp32, {"fp16", {150, 150, 150}, {-1, -1, -1}}).verdict, "measured");

  // A memory claim of a 30% saving: B's peak at most 0.70 of A's in every round.
  Claim memory;
  memory.kind = ClaimKind::memory;
  memory.threshold = 0.30;
  const SideRounds a{"fp32", {100, 100}, {1000, 1000}};
  const ClaimRow saves = judge_step_claim(memory, {}, a, {"fp16", {200, 200}, {520, 550}});
  EXPECT_EQ(saves.verdict, "holds");
  EXPECT_DOUBLE_EQ(saves.claimed, 0.70);
  EXPECT_EQ(judge_step_claim(memory, {}, a, {"fp16", {200, 200}, {880, 880}}).verdict, "does not hold");
  // Where the device measures no peak memory (the CPU), the time paid alone.
  const ClaimRow cpu = judge_step_claim(memory, {}, {"fp32", {100, 100}, {-1, -1}}, {"fp16", {50, 50}, {-1, -1}});
  EXPECT_EQ(cpu.verdict, "not measurable here: peak memory is measured on CUDA devices");
  EXPECT_EQ(cpu.measured, "time per image +100% (fp16 vs fp32)");
}

TEST(ReproduceClaims, TwoVariantsOfOneNameOnThisConfigAreRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  testing::write_file(dir.path() / "base.json", R"({"run": {"device": "cpu"}})");
  nlohmann::json claims = small_claims();
  claims["variants"]["fp32 NCHW"] = {"precision.mode=fp32"};  // "{mode} NCHW" is that too under fp32
  testing::write_file(dir.path() / "claims.json", claims.dump());
  ReproduceOptions options;
  options.base_config = dir.path() / "base.json";
  options.claims_file = dir.path() / "claims.json";
  try {
    reproduce(options, dir.path() / "report");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), (dir.path() / "claims.json").string() +
                                             ": variants \"fp32 NCHW\" and \"{mode} NCHW\" are both \"fp32 NCHW\" on "
                                             "this config and device; give them names of their own");
  }
  EXPECT_FALSE(fs::exists(dir.path() / "report"));
}

TEST(Reproduce, ABadClaimsFileStopsTheCommandWithExitCodeTwoBeforeAnythingIsWritten) {
  TempDir dir;
  testing::write_file(dir.path() / "base.json", R"({"run": {"device": "cpu"}})");
  nlohmann::json claims = small_claims();
  claims["variants"]["fp32"].push_back("precision.tf33=true");
  testing::write_file(dir.path() / "claims.json", claims.dump());
  const fs::path out = dir.path() / "report";
  EXPECT_EQ(testing::run_ltrain("reproduce --config " + (dir.path() / "base.json").string() + " --claims " +
                                    (dir.path() / "claims.json").string() + " --out " + out.string(),
                                dir.path() / "log"),
            2);
  const std::string log = read_file(dir.path() / "log");
  EXPECT_NE(log.find((dir.path() / "claims.json").string() + ": variants.\"fp32\"[1] = \"precision.tf33=true\": "
                                                             "unknown key \"precision.tf33\": did you mean "
                                                             "\"precision.tf32\"?\n"),
            std::string::npos)
      << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_FALSE(fs::exists(out));
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
