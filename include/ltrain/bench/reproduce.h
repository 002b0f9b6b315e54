#pragma once
// `ltrain reproduce`: the GPU guides' claims as A/B measurements on this machine. Each claim is
// measured with ltrain's own step benchmark (the same config with one switch flipped), the
// matmul test, the batch-size search, or what doctor reads off the device, and gets a verdict.
// A claim this device cannot test (fp16 on the CPU, memory where it is not measured) says why.
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ltrain::bench {

struct ReproduceOptions {
  std::filesystem::path base_config;   ///< the run config every measurement starts from
  std::vector<std::string> overrides;  ///< --set, applied to every measurement
  int64_t warmup = 10;                 ///< untimed steps per measurement
  int64_t steps = 30;                  ///< timed steps per measurement
  int64_t matmul_size = 8192;
  int64_t matmul_products = 100;
  bool batch_search = true;            ///< the 4090D guide's batch-size search (a GPU only)
};

struct ClaimRow {
  std::string claim;     ///< what a guide says
  std::string guide;     ///< which guide says it
  std::string measured;  ///< what was measured here, with its numbers
  double ratio = std::numeric_limits<double>::quiet_NaN();    ///< B over A where the claim is a ratio
  double claimed = std::numeric_limits<double>::quiet_NaN();  ///< the ratio the claim needs (at least / at most)
  std::string verdict;   ///< "holds", "does not hold", "measured" or "not measurable here: why"
};

struct ReproduceReport {
  std::string device;            ///< doctor's one-line description of the device
  std::vector<ClaimRow> rows;
  nlohmann::json measurements = nlohmann::json::object();  ///< every raw result, by name
};

/// Runs every measurement; `out_dir` receives the batch search's sweep files.
ReproduceReport reproduce(const ReproduceOptions& options, const std::filesystem::path& out_dir);

/// Writes REPORT.md and results.json into `out_dir`; returns REPORT.md's text.
std::string write_report(const ReproduceReport& report, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
