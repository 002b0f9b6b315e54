#pragma once
// Config sweeps (`ltrain sweep --config SWEEP.json`): a base run config, keys with lists of values
// (a grid, every combination; a zip, values taken together), and per point either timed steps
// (mode "bench") or a full training run (mode "train"); or a batch-size search that doubles
// data.batch_size until the step's peak memory reaches a fraction of the GPU, as the 4090D guide
// advises, then bisects between the last batch under the fraction and the first past it (or out
// of memory) to land near the fraction. A point that fails (out of memory, a bad combination)
// becomes a row with its error, never the end of the sweep. The file's keys are described, read
// and checked in config/sweep_spec.h; configs/sweeps/README.md has examples.
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
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"

namespace ltrain::bench {

struct SweepPoint {
  std::vector<std::pair<std::string, nlohmann::json>> settings;  ///< key -> value, in grid order
  std::map<std::string, double> values;  ///< measured: img_per_s, ms_per_step, peak_gib, test_acc, ...
  std::string error;                     ///< why the point failed ("" when it ran)
  /// What makes two points the same measurement (the resolved config, its device, the mode and
  /// the timed steps, hashed); "" for a point whose config does not resolve.
  std::string key;
  bool reused = false;  ///< taken from an earlier run's results.json, not measured again
};

using config::BatchSearch;

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
  /// False while the sweep runs, and for one that was stopped (a signal, a time limit) before its
  /// last point: results.json says so ("finished"), results.md opens with it.
  bool finished = true;
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
  std::vector<std::string> overrides;            ///< the command line's run config overrides, every point after set
  std::vector<std::vector<std::string>> points;  ///< each point's "key=value" settings (scale_lr_with's LR too)
  std::optional<BatchSearch> batch_search;       ///< with it, each point is where a search starts
};

/// Checks a sweep description without running it: the file (config::load_sweep, which applies the
/// overrides of sweep keys among `overrides`), and every point as a config (the base config, its
/// "set", the run config overrides among `overrides`, the point's settings; with batch_search at
/// its start batch); `on_this_machine`, also what this machine must offer each point's run
/// (engine::check_device_support: its device, fp16 or TF32 there; a CUDA device for a batch
/// search) and a batch no larger than the training set (the data read once). ConfigError naming
/// the file and what is wrong, or every point that is no valid config or cannot run here, a line
/// for each with its settings and why; DataError when the data cannot be read.
SweepPlan plan_sweep(const std::filesystem::path& sweep_file, const std::vector<std::string>& overrides = {},
                     bool on_this_machine = false);

/// Observers and stand-ins of a sweep (tests use them).
struct SweepHooks {
  /// Measures a bench point in place of timed steps on its device: the point's values (img_per_s,
  /// memory_fraction, ...). A batch search then needs no CUDA device.
  std::function<std::map<std::string, double>(const config::LoadedConfig& point)> measure;
  /// After each point's row is written, with the number of rows.
  std::function<void(int64_t rows)> after_point;
};

/// Runs the sweep described by `sweep_file`; points' run directories (mode train) go under
/// `out_dir`/runs/point-NNN-SETTINGS, which is created first (ConfigError when it cannot be),
/// unless the file's "set" or `overrides` set run.out_dir. `overrides` (--set) of sweep keys apply
/// to the file, the others to every point after the file's "set". First every point is checked as
/// plan_sweep(on_this_machine) does: a ConfigError with a line for each point refused, before
/// anything is written. The results files (write_sweep_results) are rewritten as each point (each
/// batch of a search) finishes, so a sweep cut short keeps what it measured; unless `fresh`, a
/// point whose key (SweepPoint::key) matches a finished row of `out_dir`/results.json is taken from
/// there instead of being run again, so the same command continues a sweep, a batch search
/// included. SIGINT or SIGTERM stops the point in progress at its next step and then the sweep:
/// Interrupted (exit code 130), the results of the points before it written and marked unfinished.
SweepResult run_sweep(const std::filesystem::path& sweep_file, const std::filesystem::path& out_dir,
                      const std::vector<std::string>& overrides = {}, bool fresh = false,
                      const SweepHooks& hooks = {});

/// Writes results.csv, results.md and results.json (with the provenance and whether the sweep
/// finished) into `out_dir`; returns the Markdown table (after a line saying so where the sweep
/// did not finish).
std::string write_sweep_results(const SweepResult& result, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
