#pragma once
// `ltrain reproduce`: the GPU guides' claims as A/B measurements on this machine. Each claim is
// tied to the guide and the line that makes it, and measured with ltrain's own step benchmark (the
// same config with one switch flipped, A and B alternating over several rounds, at each image size
// asked for), the matmul test, the batch-size search, or set against what the driver reports and
// the cards' published figures. A verdict is given only where the measured spread allows one.
//
// The parts: the claims as data (claims.h, configs/claims/guides.json), the statistics
// (reproduce_stats.h), the runner of a claim over the step measurements (claim_runner.h), the
// report (reproduce_report.h); reproduce() runs them in order.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ltrain/bench/claims.h"
#include "ltrain/bench/reproduce_report.h"
#include "ltrain/bench/reproduce_stats.h"

namespace ltrain::bench {

struct ReproduceOptions {
  std::filesystem::path base_config;   ///< the run config every measurement starts from
  std::vector<std::string> overrides;  ///< --set, applied to every measurement
  /// The claims to measure, a file as configs/claims/guides.json; empty: that file as ltrain
  /// carries it (shipped_claims()).
  std::filesystem::path claims_file;
  int64_t warmup = 10;                 ///< untimed steps per measurement
  int64_t steps = 30;                  ///< timed steps per measurement
  int64_t rounds = 3;                  ///< A/B rounds per claim: A, B, A, B, ...
  /// Sides of the images the A/B claims are measured at; empty: the base config's data.image_size.
  /// A side other than 32 measures on random images of that side (data.source synthetic).
  std::vector<int64_t> image_sizes;
  int64_t matmul_size = 8192;
  int64_t matmul_products = 100;
  bool batch_search = true;            ///< the batch-size search claims (a GPU only)
  /// Start over; otherwise an unfinished report of the same settings in the report folder is
  /// continued, its measurements reused.
  bool fresh = false;
};

/// Runs every claim of the catalogue (options.claims_file, else the one ltrain carries; a
/// ConfigError for a bad one before anything is measured), writing the report so far
/// (write_report, unfinished) into `out_dir` after each measurement, so that a run cut short
/// keeps them; `out_dir` receives the batch search's sweep files too. The A/B step claims come
/// first, at each image size, then the others in the catalogue's order. Unless options.fresh, an
/// unfinished report in `out_dir` of the same settings is continued: its measurements are reused
/// (ReproduceReport::reused); ConfigError for one of other settings, which it would replace. The
/// report returned is finished.
ReproduceReport reproduce(const ReproduceOptions& options, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
