#pragma once
// Config sweeps (`ltrain sweep --config SWEEP.json`): a base run config, keys with lists of values
// (a grid, every combination; a zip, values taken together), and per point either timed steps
// (mode "bench") or a full training run (mode "train"); or a batch-size search that doubles
// data.batch_size until the step's peak memory reaches a fraction of the GPU, as the 4090D guide
// advises, then bisects between the last batch under the fraction and the first past it (or out
// of memory) to land near the fraction. A point that fails (out of memory, a bad combination)
// becomes a row with its error, never the end of the sweep. configs/sweeps/README.md has examples.
//
//   {"base": "../bench/resnet50-step.json",          (relative to the sweep file)
//    "set": ["precision.cudnn_benchmark=true"],      (optional, every point)
//    "mode": "bench",                                ("bench" or "train")
//    "grid": {"precision.mode": ["fp16", "bf16"]},   (every combination, the first key slowest)
//    "zip": {"data.batch_size": [256, 512], "schedule.warmup_epochs": [1, 2]},  (lists of one length:
//                                                    the i-th values together; points: grid x zip)
//    "scale_lr_with": {"key": "data.batch_size", "reference": 256},  (optim.lr = base config's LR
//                                                    * value / reference: the linear scaling rule)
//    "bench": {"warmup": 10, "steps": 30},
//    "batch_search": {"start": 256, "factor": 2, "memory_fraction": 0.9, "max": 65536, "refine": 3}}
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ltrain::bench {

/// The most points a sweep may have (the product of its grid lists' lengths, times its zip lists' length).
constexpr int64_t kMaxSweepPoints = 10000;

struct SweepPoint {
  std::vector<std::pair<std::string, nlohmann::json>> settings;  ///< key -> value, in grid order
  std::map<std::string, double> values;  ///< measured: img_per_s, ms_per_step, peak_gib, test_acc, ...
  std::string error;                     ///< why the point failed ("" when it ran)
};

struct BatchSearch {
  int64_t start = 256;
  double factor = 2.0;
  double memory_fraction = 0.9;
  int64_t max = 65536;
  int64_t refine = 3;  ///< bisections after the growth passes the fraction; batches stay multiples of start
};

/// The batch sizes a search tries, one at a time: start, start*factor, ... while each point runs
/// and stays under the memory fraction; then up to `refine` bisections between the largest batch
/// under the fraction and the smallest one past it or failed. Memory grows about linearly with
/// the batch, so three bisections after a doubling land within 1/8 of the fraction's batch.
class BatchSearchPlan {
 public:
  explicit BatchSearchPlan(BatchSearch search);
  /// The next batch to measure, or nullopt when the search is done.
  std::optional<int64_t> next() const;
  /// What the batch next() gave measured: its peak memory as a fraction of the device, or
  /// nullopt when the point failed (out of memory).
  void record(int64_t batch, std::optional<double> memory_fraction);
  /// The largest batch that ran under the fraction so far (0: none).
  int64_t best() const { return under_; }

 private:
  BatchSearch search_;
  int64_t growing_;     ///< the next batch of the growth phase; 0 once it has ended
  int64_t under_ = 0;   ///< largest batch at or under the fraction
  int64_t over_ = 0;    ///< smallest batch past the fraction or failed (0: none yet)
  int64_t refined_ = 0;
};

struct SweepResult {
  /// io::provenance of the sweep: the sweep file, the base config and the files it extends, and
  /// the SHA-256 of the base resolved with the sweep's "set" and --set (each point adds its grid
  /// values; null when that alone does not resolve). Null for a result not made by run_sweep.
  nlohmann::json provenance;
  std::string mode;
  std::vector<std::string> keys;     ///< the swept keys (columns before the measured ones)
  std::vector<std::string> columns;  ///< the measured columns, in order
  std::vector<SweepPoint> points;
};

/// What a sweep would run, without running it.
struct SweepPlan {
  std::string mode;
  std::filesystem::path base;
  std::vector<std::string> set;                  ///< the file's "set", every point
  std::vector<std::vector<std::string>> points;  ///< each point's "key=value" settings (scale_lr_with's LR too)
  std::optional<BatchSearch> batch_search;       ///< with it, each point is where a search starts
};

/// Checks a sweep description without running it: its format, and every point as a config (the
/// base config, its "set", `overrides`, the point's settings; with batch_search at its start
/// batch). ConfigError naming the file and what is wrong, or the first point that is no valid
/// config, its settings and why.
SweepPlan plan_sweep(const std::filesystem::path& sweep_file, const std::vector<std::string>& overrides = {});

/// Runs the sweep described by `sweep_file`; points' run directories (mode train) go under
/// `out_dir`/runs, which is created first (ConfigError when it cannot be). `overrides` (--set) apply to every point after the file's "set". The results
/// files (write_sweep_results) are rewritten as the points finish, so a sweep cut short keeps
/// what it measured.
/// ConfigError naming the file for a malformed sweep description, a base config that is not a
/// file, a grid (times the zip) of more than kMaxSweepPoints points, zip lists of different
/// lengths, or a point that sets optim.lr with scale_lr_with.
SweepResult run_sweep(const std::filesystem::path& sweep_file, const std::filesystem::path& out_dir,
                      const std::vector<std::string>& overrides = {});

/// Writes results.csv, results.md and results.json (with the provenance) into `out_dir`; returns the
/// Markdown table.
std::string write_sweep_results(const SweepResult& result, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
