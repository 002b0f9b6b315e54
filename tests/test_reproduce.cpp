// ltrain reproduce, reduced to a tiny model on the CPU: every claim gets a row, measured where the
// CPU can measure it and "not measurable here" with the reason elsewhere.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ltrain/bench/reproduce.h"
#include "support.h"

namespace ltrain::bench {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;

TEST(Reproduce, ReducedRunOnTheCpuWritesEveryClaim) {
  TempDir dir;
  testing::write_file(dir.path() / "base.json", R"({"run": {"device": "cpu"},
    "model": {"arch": "resnet18", "stem": "cifar", "width": 4},
    "data": {"source": "synthetic", "synthetic_train_size": 128, "synthetic_test_size": 32, "batch_size": 16}})");
  ReproduceOptions options;
  options.base_config = dir.path() / "base.json";
  options.warmup = 1;
  options.steps = 2;
  options.matmul_size = 64;
  options.matmul_products = 2;
  const ReproduceReport report = reproduce(options, dir.path() / "report");
  ASSERT_EQ(report.rows.size(), 12u);
  auto row = [&](const std::string& start) {
    for (const ClaimRow& r : report.rows)
      if (r.claim.rfind(start, 0) == 0) return r;
    ADD_FAILURE() << "no claim starting " << start;
    return ClaimRow{};
  };
  EXPECT_EQ(row("AMP (fp16").verdict.rfind("not measurable here: ", 0), 0u);
  EXPECT_NE(row("AMP (fp16").verdict.find("fp16 autocast needs a CUDA device"), std::string::npos);
  EXPECT_NE(row("TF32").verdict.find("TF32 is a feature of NVIDIA GPUs"), std::string::npos);
  EXPECT_NE(row("CUDA graphs").verdict.find("fp16"), std::string::npos);
  // The CPU times accumulation and checkpointing but cannot measure their memory.
  const ClaimRow accumulation = row("gradient accumulation");
  EXPECT_NE(accumulation.claim.find("(16 images)"), std::string::npos) << accumulation.claim;
  EXPECT_NE(accumulation.measured.find("time per image"), std::string::npos) << accumulation.measured;
  EXPECT_EQ(accumulation.verdict, "not measurable here: peak memory is measured on CUDA devices");
  EXPECT_NE(row("activation checkpointing").measured.find("time per image"), std::string::npos);
  EXPECT_EQ(row("matmul TFLOPS test (n = 64, 2 timed products), fp32").verdict, "measured");
  EXPECT_EQ(row("matmul TFLOPS test (n = 64, 2 timed products), tf32").verdict,
            "not measurable here: TF32 is a feature of NVIDIA GPUs");
  EXPECT_EQ(row("grow the batch").verdict, "not measurable here: the search measures GPU memory");
  EXPECT_EQ(row("the card has 24 GB").verdict, "differs from this device");

  const std::string text = write_report(report, dir.path() / "report");
  EXPECT_NE(text.find("| claim | guide | measured here | ratio | verdict |"), std::string::npos);
  EXPECT_EQ(read_file(dir.path() / "report" / "REPORT.md"), text);
  const nlohmann::json saved = nlohmann::json::parse(read_file(dir.path() / "report" / "results.json"));
  EXPECT_EQ(saved["claims"].size(), 12u);
  EXPECT_TRUE(saved["measurements"]["steps"].contains("fp32"));
  EXPECT_EQ(saved["measurements"]["matmul"].size(), 4u);

  // The report's plot.
  if (const auto python = testing::python_with_matplotlib()) {
    ASSERT_EQ(testing::run_plot_script(*python, "plot_report.py", (dir.path() / "report").string(), dir.path() / "plot"),
              0)
        << read_file(dir.path() / "plot");
    EXPECT_EQ(read_file(dir.path() / "report" / "claims.png").substr(1, 3), "PNG");
  }

  // Through the command line, with a base config that does not exist: exit code 2.
  EXPECT_EQ(testing::run_ltrain("reproduce --config " + (dir.path() / "none.json").string(), dir.path() / "log"), 2);
}

}  // namespace
}  // namespace ltrain::bench
