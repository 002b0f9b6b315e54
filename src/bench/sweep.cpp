#include "ltrain/bench/sweep.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/step_bench.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/interrupt.h"
#include "ltrain/core/sha256.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/io/provenance.h"
#include "ltrain/io/run_files.h"

namespace ltrain::bench {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
/// Untimed steps before the first bench point of a sweep (bench.warmup when larger).
constexpr int64_t kProcessWarmupSteps = 5;
/// The largest earlier results.json read back (10,000 points take a few MB).
constexpr std::size_t kMaxResultsBytes = 256u << 20;

using Settings = std::vector<std::pair<std::string, json>>;

/// A sweep file as config::load_sweep reads it, with scale_lr_with's base LR resolved.
struct PreparedSweep {
  config::LoadedSweep sweep;
  double base_lr = 0.0;  ///< with scale_lr_with: optim.lr of the base config with "set" and the command line's overrides
  const config::SweepSpec& spec() const { return sweep.spec; }
};

ConfigError spec_error(const fs::path& file, const std::string& message) {
  return ConfigError(fmt::format("{}: {}", file.string(), message));
}

std::string settings_text(const Settings& settings) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : settings) parts.push_back(key + "=" + value.dump());
  return fmt::format("{}", fmt::join(parts, " "));
}

/// With scale_lr_with: the point's optim.lr, scaled linearly from the base LR, added last.
/// ConfigError when the point sets optim.lr itself (the two would contradict each other).
void add_scaled_lr(const PreparedSweep& prepared, int64_t index, Settings& settings) {
  if (!prepared.spec().scale_lr_with) return;
  const config::LrScaling& lr = *prepared.spec().scale_lr_with;
  const fs::path& file = prepared.sweep.file;
  std::optional<double> value;
  for (const auto& [key, setting] : settings) {
    const bool sets_lr = key == "optim.lr" || (key == "optim" && setting.is_object() && setting.contains("lr"));
    if (sets_lr)
      throw spec_error(file, fmt::format("point {} ({}) sets optim.lr itself, which scale_lr_with computes from "
                                         "{}; take optim.lr out of the grid and zip (the base config's LR is "
                                         "the one at {} = {:g}), or drop scale_lr_with",
                                         index, settings_text(settings), lr.key, lr.key, lr.reference));
    if (key == lr.key) {
      if (!setting.is_number() || !(setting.get<double>() > 0.0))
        throw spec_error(file, fmt::format("point {} ({}): scale_lr_with needs {} to be a number > 0", index,
                                           settings_text(settings), lr.key));
      value = setting.get<double>();
    }
  }
  if (value) settings.emplace_back("optim.lr", prepared.base_lr * *value / lr.reference);
}

/// The overrides of one point: the file's "set", the command line's overrides, then the point's settings.
std::vector<std::string> point_overrides(const config::LoadedSweep& sweep, const Settings& settings) {
  std::vector<std::string> sets = sweep.spec.set;
  sets.insert(sets.end(), sweep.point_overrides.begin(), sweep.point_overrides.end());
  for (const auto& [key, value] : settings) sets.push_back(key + "=" + value.dump());
  return sets;
}

/// The file read and checked (config::load_sweep), with scale_lr_with's base LR resolved from the
/// base config, "set" and the command line's overrides.
PreparedSweep prepare(const fs::path& file, const std::vector<std::string>& overrides) {
  PreparedSweep prepared{config::load_sweep(file, overrides)};
  if (prepared.spec().scale_lr_with)
    prepared.base_lr = config::load_file(prepared.sweep.base, point_overrides(prepared.sweep, {})).config.optim.lr;
  return prepared;
}

/// The points: every combination of the grid's values (the first key varying slowest), each with
/// each of zip's tuples, and scale_lr_with's LR (not with batch_search, whose batches come later).
std::vector<Settings> expand(const PreparedSweep& prepared) {
  const config::SweepSpec& spec = prepared.spec();
  std::vector<Settings> points{{}};
  for (const auto& [key, values] : spec.grid) {
    std::vector<Settings> next;
    for (const auto& point : points)
      for (const json& value : values) {
        next.push_back(point);
        next.back().emplace_back(key, value);
      }
    points = std::move(next);
  }
  if (!spec.zip.empty()) {
    std::vector<Settings> next;
    for (const auto& point : points)
      for (size_t i = 0; i < spec.zip.front().second.size(); ++i) {
        next.push_back(point);
        for (const auto& [key, values] : spec.zip) next.back().emplace_back(key, values[i]);
      }
    points = std::move(next);
  }
  if (!spec.batch_search)
    for (size_t i = 0; i < points.size(); ++i) add_scaled_lr(prepared, static_cast<int64_t>(i), points[i]);
  return points;
}

/// Whether the overrides `sets` choose run.out_dir (the key, or a run section that holds it).
bool sets_run_out_dir(const std::vector<std::string>& sets) {
  return std::any_of(sets.begin(), sets.end(), [](const std::string& set) {
    return set.rfind("run.out_dir=", 0) == 0 || (set.rfind("run=", 0) == 0 && set.find("\"out_dir\"") != std::string::npos);
  });
}

/// What makes two points the same measurement: the resolved config, the device it resolves to,
/// the mode and the timed steps. Points of an earlier run of a sweep with the same key are reused.
std::string point_key(const config::LoadedConfig& loaded, const config::SweepSpec& spec) {
  const json identity{{"config", config::to_json(loaded.config)},
                      {"device", engine::resolve_device(loaded).str()},
                      {"mode", config::to_string(spec.mode)},
                      {"bench", spec.mode == config::SweepMode::bench
                                    ? json{spec.bench.warmup, spec.bench.steps, spec.bench.rounds}
                                    : json(nullptr)}};
  const std::string text = identity.dump();
  return sha256_hex(text.data(), text.size());
}

/// The finished points of an earlier run in `out_dir`/results.json, by their key ({} when there
/// is none, or it cannot be read: then every point runs, and a warning says why).
std::map<std::string, json> earlier_points(const fs::path& out_dir) {
  const fs::path file = out_dir / "results.json";
  std::map<std::string, json> points;
  if (!files::not_a_regular_file(file).empty()) return points;
  try {
    const files::TextRead read = files::read_regular_file(file, kMaxResultsBytes);
    if (!read.problem.empty()) throw std::runtime_error(read.problem);
    const json earlier = json::parse(read.text);
    for (const json& row : earlier.at("rows"))
      if (row.contains("point_key") && row.at("point_key").is_string() && row.value("error", json(nullptr)).is_null())
        points[row.at("point_key").get<std::string>()] = row;
  } catch (const std::exception& error) {
    spdlog::warn("{}: cannot read the earlier results ({}); every point runs", file.string(),
                 compat::first_line(error.what()));
    points.clear();
  }
  return points;
}

/// A training point's run.name: its number and what it sets, as Hydra's override_dirname says it
/// ("point-001-optim.lr=0.05,data.batch_size=256"), cut to a length every file system takes.
std::string point_run_name(int64_t index, const Settings& settings) {
  constexpr size_t kMaxSettingsBytes = 120;
  std::string text;
  for (const auto& [key, value] : settings) {
    const std::string value_text = value.is_string() ? value.get<std::string>() : value.dump();
    text += (text.empty() ? "" : ",") + key + "=" + value_text;
  }
  for (char& c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '/' || c == '\\' || c == ' ' || byte < 0x20 || byte == 0x7f) c = '_';
  }
  if (text.size() > kMaxSettingsBytes) {
    size_t cut = kMaxSettingsBytes;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
    text = text.substr(0, cut) + "...";
  }
  return fmt::format("point-{:03d}{}", index, text.empty() ? "" : "-" + text);
}

class SweepRunner {
 public:
  SweepRunner(PreparedSweep prepared, fs::path out_dir, SweepResult& result, const SweepHooks& hooks)
      : prepared_(std::move(prepared)), out_dir_(std::move(out_dir)), result_(result), hooks_(hooks) {}

  /// Points of an earlier run that run() takes instead of measuring them again.
  void reuse(std::map<std::string, json> earlier) { earlier_ = std::move(earlier); }

  /// Where the points' run directories go (mode train): run.out_dir where the file's "set" or
  /// the command line sets it, else OUT/runs.
  std::string runs_dir() const {
    if (sets_run_out_dir(point_overrides(prepared_.sweep, {}))) return "run.out_dir as set";
    return (out_dir_ / "runs").string();
  }

  /// Runs one point, or takes it from an earlier run; fills `point.values` or `point.error`.
  void run(SweepPoint& point, int64_t index) {
    const config::SweepSpec& spec = prepared_.spec();
    std::vector<std::string> sets = point_overrides(prepared_.sweep, point.settings);
    if (spec.mode == config::SweepMode::train) {
      if (!sets_run_out_dir(sets)) sets.push_back("run.out_dir=" + (out_dir_ / "runs").string());
      sets.push_back("run.name=" + nlohmann::json(point_run_name(index, point.settings)).dump());
    }
    const auto started = std::chrono::steady_clock::now();
    try {
      const config::LoadedConfig loaded = config::load_file(prepared_.sweep.base, sets);
      point.key = point_key(loaded, spec);
      if (const auto earlier = earlier_.find(point.key); earlier != earlier_.end()) {
        take_earlier(point, earlier->second);
        log_point(point, index, 0.0);
        return;
      }
      if (spec.mode == config::SweepMode::bench && hooks_.measure) {
        point.values = hooks_.measure(loaded);
      } else if (spec.mode == config::SweepMode::bench) {
        if (!process_warm_) {
          // The process's first steps pay once for what later points find ready (thread pools,
          // allocator caches, kernels loaded): untimed, so that the first point is timed as the others.
          spdlog::info("sweep point {}: warming up the process (untimed)", index);
          bench_steps(loaded, std::max<int64_t>(spec.bench.warmup, kProcessWarmupSteps), 1);
          process_warm_ = true;
        }
        const StepBenchResult r = bench_steps(loaded, spec.bench.warmup, spec.bench.steps, "", spec.bench.rounds);
        const auto [low, high] =
            std::minmax_element(r.round_images_per_second.begin(), r.round_images_per_second.end());
        point.values = {{"img_per_s", r.images_per_second},
                        {"img_per_s_low", *low},
                        {"img_per_s_high", *high},
                        {"ms_per_step", r.ms_per_step}};
        if (r.peak_memory_bytes >= 0) point.values["peak_gib"] = static_cast<double>(r.peak_memory_bytes) / kGiB;
        if (r.peak_reserved_bytes >= 0) {
          point.values["reserved_gib"] = static_cast<double>(r.peak_reserved_bytes) / kGiB;
          const int64_t total = compat::device_memory_bytes(engine::resolve_device(loaded));
          if (total > 0) point.values["memory_fraction"] = static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(total);
        }
      } else {
        const engine::TrainResult r = engine::train(loaded);
        point.values = {{"test_acc", r.final_test_accuracy}, {"best_test_acc", r.best_test_accuracy},
                        {"train_s", r.train_seconds},        {"wall_s", r.wall_seconds},
                        {"img_per_s", r.images_per_second}};
      }
    } catch (const Interrupted&) {
      throw;  // Ctrl-C or SIGTERM in a training point stops the sweep, not just the point
    } catch (const UserError& error) {
      point.error = compat::failure_summary(error);
    } catch (const c10::Error& error) {
      point.error = compat::failure_summary(error);
    }
    log_point(point, index, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }

  /// Runs the point with `settings` and records it (record()).
  void run_point(const Settings& settings) {
    SweepPoint point;
    point.settings = settings;
    run(point, points_done());
    record(std::move(point));
  }

  /// The batch-size search on top of `settings` (BatchSearchPlan); every batch tried is a row,
  /// recorded as it ends. Batches measured by an earlier run are taken from it (run()), so a search
  /// cut short goes on where it stopped.
  void search(const Settings& settings) {
    BatchSearchPlan plan(*prepared_.spec().batch_search);
    while (const std::optional<int64_t> batch = plan.next()) {
      SweepPoint point;
      point.settings = settings;
      point.settings.emplace_back("data.batch_size", *batch);
      add_scaled_lr(prepared_, points_done(), point.settings);
      run(point, points_done());
      const auto fraction = point.values.find("memory_fraction");
      if (point.error.empty() && fraction == point.values.end()) {
        point.error = "batch_search needs a CUDA device (peak memory is measured there)";
        record(std::move(point));
        return;
      }
      const std::optional<double> memory =
          point.error.empty() ? std::optional<double>(fraction->second) : std::nullopt;
      record(std::move(point));
      plan.record(*batch, memory);
    }
  }

  /// Adds `point` to the results and writes them (a sweep cut short keeps what it measured);
  /// Interrupted when a stop was asked for meanwhile, which the sweep then honours.
  void record(SweepPoint point) {
    result_.points.push_back(std::move(point));
    write_sweep_results(result_, out_dir_);
    if (hooks_.after_point) hooks_.after_point(points_done());
    if (interrupt::stop_requested())
      throw Interrupted(fmt::format("stopped by signal {} after point {}", interrupt::stop_signal(), points_done() - 1));
  }

  int64_t points_done() const { return static_cast<int64_t>(result_.points.size()); }

  const PreparedSweep& prepared() const { return prepared_; }

 private:
  /// The measured values of an earlier run's row.
  static void take_earlier(SweepPoint& point, const json& row) {
    for (const auto& [column, value] : row.items())
      if (value.is_number() && column != "point_key") point.values[column] = value.get<double>();
    // A number among the settings is no measurement.
    for (const auto& [key, setting] : point.settings) point.values.erase(key);
    point.reused = true;
  }

  /// One line per point as it ends: a long sweep shows where it is.
  static void log_point(const SweepPoint& point, int64_t index, double seconds) {
    std::string values;
    const std::string settings = point.settings.empty() ? "" : " " + settings_text(point.settings);
    for (const auto& [key, value] : point.values) values += fmt::format(" {} {:.4g}", key, value);
    if (point.reused) {
      spdlog::info("sweep point {}:{} |{} (reused from the earlier run)", index, settings, values);
      return;
    }
    spdlog::info("sweep point {}:{} |{} ({:.0f} s)", index, settings,
                 point.error.empty() ? values : " failed: " + point.error, seconds);
  }

  PreparedSweep prepared_;
  fs::path out_dir_;
  SweepResult& result_;
  const SweepHooks& hooks_;
  std::map<std::string, json> earlier_;
  bool process_warm_ = false;  ///< a bench point has run in this process
};

std::string cell(const SweepPoint& point, const std::string& column) {
  const auto it = point.values.find(column);
  return it == point.values.end() ? "" : fmt::format("{:.4g}", it->second);
}

std::string setting_text(const json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

/// Where the sweep's results come from: SweepResult::provenance.
json sweep_provenance(const config::LoadedSweep& sweep, std::chrono::system_clock::time_point started) {
  std::vector<std::string> files{sweep.file.string()};
  json resolved = nullptr;
  try {
    const config::LoadedConfig base = config::load_file(sweep.base, point_overrides(sweep, {}));
    files.insert(files.end(), base.files.begin(), base.files.end());
    resolved = config::to_json(base.config);
  } catch (const ConfigError&) {
    files.push_back(sweep.base.string());  // the points' rows say what is wrong
  }
  return io::provenance(files, resolved, started);
}

/// The results of `spec` before any point: its mode, the swept keys and the measured columns.
SweepResult empty_result(const config::SweepSpec& spec) {
  SweepResult result;
  result.mode = config::to_string(spec.mode);
  for (const auto& [key, values] : spec.grid) result.keys.push_back(key);
  for (const auto& [key, values] : spec.zip) result.keys.push_back(key);
  if (spec.batch_search) result.keys.push_back("data.batch_size");
  if (spec.scale_lr_with) result.keys.push_back("optim.lr");
  result.columns = spec.mode == config::SweepMode::bench
                       ? std::vector<std::string>{"img_per_s", "img_per_s_low", "img_per_s_high", "ms_per_step",
                                                  "peak_gib", "reserved_gib", "memory_fraction"}
                       : std::vector<std::string>{"test_acc", "best_test_acc", "train_s", "wall_s", "img_per_s"};
  return result;
}

/// The training images of the data `loaded` trains on, read once per data section in `known`
/// (a synthetic set's size is its setting: nothing is made).
int64_t training_images(const config::LoadedConfig& loaded, std::map<std::string, int64_t>& known) {
  const config::DataSection& data = loaded.config.data;
  if (data.source == config::DataSource::synthetic) return data.synthetic_train_size;
  const std::string key = config::to_json(loaded.config)["data"].dump();
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  return known[key] = engine::load_data(loaded.config, torch::kCPU).train.size();
}

/// Checks each point as a config (the base config, its "set", the run config overrides, the
/// point's settings; with batch_search at its start batch) and, `on_this_machine`, what its run
/// would refuse at start here: the device's settings (fp16 on the CPU), a batch larger than the
/// training set (the data read once), and a batch search without a CUDA device to measure memory
/// on (`search_needs_cuda`). Returns each point's "key=value" settings; ConfigError naming the
/// file and every point refused, a line for each. DataError when the data cannot be read.
std::vector<std::vector<std::string>> check_points(const PreparedSweep& prepared, const std::vector<Settings>& points,
                                                   bool on_this_machine, bool search_needs_cuda) {
  const config::SweepSpec& spec = prepared.spec();
  const fs::path& file = prepared.sweep.file;
  std::vector<std::vector<std::string>> checked_points;
  std::vector<std::string> problems;
  std::map<std::string, int64_t> known_data;
  for (const Settings& settings : points) {
    const int64_t index = static_cast<int64_t>(checked_points.size());
    std::vector<std::string> point;
    for (const auto& [key, value] : settings) point.push_back(key + "=" + value.dump());
    checked_points.push_back(std::move(point));
    // A batch-size search starts at its first batch: check the point's config there.
    Settings checked = settings;
    if (spec.batch_search) {
      checked.emplace_back("data.batch_size", spec.batch_search->start);
      add_scaled_lr(prepared, index, checked);
    }
    // Each line of `error` (a config's problems come a line each) names the point.
    const auto refuse = [&](const std::string& why, const std::string& error) {
      std::istringstream lines(error);
      for (std::string line; std::getline(lines, line);)
        problems.push_back(
            spec_error(file, fmt::format("point {} ({}) {}: {}", index, settings_text(checked), why, line)).what());
    };
    std::optional<config::LoadedConfig> loaded;
    try {
      loaded = config::load_file(prepared.sweep.base, point_overrides(prepared.sweep, checked));
    } catch (const ConfigError& error) {
      refuse("is not a valid config", error.what());
      continue;
    }
    if (spec.mode == config::SweepMode::bench) {
      try {
        check_bench_warmup(loaded->config, spec.bench.warmup, "bench.warmup");
      } catch (const ConfigError& error) {
        refuse("is not a valid config", error.what());
        continue;
      }
    }
    if (!on_this_machine) continue;
    try {
      engine::check_device_support(*loaded);
    } catch (const ConfigError& error) {
      refuse("cannot run on this machine", error.what());
      continue;
    }
    if (spec.batch_search && search_needs_cuda) {
      const torch::Device device = engine::resolve_device(*loaded);
      if (!device.is_cuda()) {
        refuse("cannot run on this machine",
               fmt::format("batch_search measures each batch's peak memory on a CUDA device, and run.device resolves "
                           "to {} here; run the search on a GPU host",
                           device.str()));
        continue;
      }
    }
    try {
      engine::check_batch_fits(*loaded, training_images(*loaded, known_data));
    } catch (const ConfigError& error) {
      refuse("is not a valid config", error.what());
    }
  }
  if (!problems.empty()) throw ConfigError(fmt::format("{}", fmt::join(problems, "\n")));
  return checked_points;
}

}  // namespace

BatchSearchPlan::BatchSearchPlan(BatchSearch search) : search_(search), growing_(search.start) {}

std::optional<int64_t> BatchSearchPlan::next() const {
  if (growing_ > 0) return growing_;
  if (over_ == 0 || refined_ >= search_.refine) return std::nullopt;
  // Bisect on multiples of start; stop when no such multiple lies strictly between the two.
  const int64_t lo = under_ > 0 ? under_ : 0;
  const int64_t mid = (lo + over_) / 2 / search_.start * search_.start;
  if (mid <= lo || mid >= over_) return std::nullopt;
  return mid;
}

void BatchSearchPlan::record(int64_t batch, std::optional<double> memory_fraction) {
  const bool under = memory_fraction && *memory_fraction <= search_.memory_fraction;
  if (under) {
    under_ = std::max(under_, batch);
  } else {
    over_ = over_ == 0 ? batch : std::min(over_, batch);
  }
  if (growing_ > 0) {
    const auto grown = static_cast<int64_t>(static_cast<double>(batch) * search_.factor);
    // The growth ends past the fraction, on a failure, exactly at the fraction, or at max.
    const bool reached = memory_fraction && *memory_fraction >= search_.memory_fraction;
    growing_ = under && !reached && grown <= search_.max ? grown : 0;
  } else {
    ++refined_;
  }
}

SweepPlan plan_sweep(const fs::path& sweep_file, const std::vector<std::string>& overrides, bool on_this_machine) {
  const PreparedSweep prepared = prepare(sweep_file, overrides);
  const config::SweepSpec& spec = prepared.spec();
  SweepPlan plan;
  plan.mode = config::to_string(spec.mode);
  plan.base = prepared.sweep.base;
  plan.set = spec.set;
  plan.overrides = prepared.sweep.point_overrides;
  plan.batch_search = spec.batch_search;
  plan.points = check_points(prepared, expand(prepared), on_this_machine, /*search_needs_cuda=*/true);
  return plan;
}

SweepResult run_sweep(const fs::path& sweep_file, const fs::path& out_dir, const std::vector<std::string>& overrides,
                      bool fresh, const SweepHooks& hooks) {
  const auto started = std::chrono::system_clock::now();
  // SIGINT and SIGTERM stop the point in progress at its next step (a training point writes its
  // checkpoint), then the sweep, with the results of the points before it written.
  const interrupt::StopRequests stop_requests;
  PreparedSweep prepared = prepare(sweep_file, overrides);
  const std::vector<Settings> points = expand(prepared);
  // Every point this machine cannot run is refused before anything is written, as --dry-run does.
  check_points(prepared, points, /*on_this_machine=*/true, /*search_needs_cuda=*/!hooks.measure);
  files::create_results_folder(out_dir, "--out");
  SweepResult result = empty_result(prepared.spec());
  result.provenance = sweep_provenance(prepared.sweep, started);
  result.finished = false;
  SweepRunner runner(std::move(prepared), out_dir, result, hooks);
  if (!fresh) {
    std::map<std::string, json> earlier = earlier_points(out_dir);
    if (!earlier.empty())
      spdlog::info("{}: {} finished point(s) of an earlier run; the points measured alike are reused (--fresh "
                   "measures every point again)",
                   (out_dir / "results.json").string(), earlier.size());
    runner.reuse(std::move(earlier));
  }
  if (runner.prepared().spec().mode == config::SweepMode::train)
    spdlog::info("the points' run directories go under {}", runner.runs_dir());
  try {
    for (const Settings& settings : points) {
      if (runner.prepared().spec().batch_search)
        runner.search(settings);
      else
        runner.run_point(settings);
    }
  } catch (const Interrupted&) {
    write_sweep_results(result, out_dir);
    throw Interrupted(fmt::format("stopped by signal {} after {} point(s) of the sweep; their results are in {} "
                                  "(marked unfinished): the same command continues the sweep, reusing them",
                                  interrupt::stop_signal(), result.points.size(), out_dir.string()));
  }
  result.finished = true;
  write_sweep_results(result, out_dir);
  return result;
}

std::string write_sweep_results(const SweepResult& result, const fs::path& out_dir) {
  fs::create_directories(out_dir);
  std::string csv, markdown = "|", rule = "|";
  std::vector<std::string> header = result.keys;
  header.insert(header.end(), result.columns.begin(), result.columns.end());
  header.push_back("error");
  for (size_t i = 0; i < header.size(); ++i) {
    csv += (i ? "," : "") + header[i];
    markdown += " " + header[i] + " |";
    rule += "---|";
  }
  csv += "\n";
  markdown += "\n" + rule + "\n";
  if (!result.finished)
    markdown = "**Unfinished**: the points below are those measured so far; the same command continues the "
               "sweep.\n\n" + markdown;
  json rows = json::array();
  for (const SweepPoint& point : result.points) {
    std::vector<std::string> cells;
    json row = json::object();
    for (const auto& [key, value] : point.settings) {
      cells.push_back(setting_text(value));
      row[key] = value;
    }
    for (const std::string& column : result.columns) {
      cells.push_back(cell(point, column));
      if (point.values.count(column)) row[column] = point.values.at(column);
    }
    cells.push_back(point.error);
    row["error"] = point.error.empty() ? json(nullptr) : json(point.error);
    if (!point.key.empty()) row["point_key"] = point.key;
    if (point.reused) row["reused"] = true;
    rows.push_back(row);
    markdown += "|";
    for (size_t i = 0; i < cells.size(); ++i) {
      // CSV: an error text may hold commas or quotes.
      const bool quote = cells[i].find_first_of(",\"") != std::string::npos;
      std::string escaped = cells[i];
      for (size_t at = escaped.find('"'); at != std::string::npos; at = escaped.find('"', at + 2)) escaped.insert(at, "\"");
      csv += (i ? "," : "") + (quote ? "\"" + escaped + "\"" : escaped);
      markdown += " " + cells[i] + " |";
    }
    csv += "\n";
    markdown += "\n";
  }
  io::write_text_file(out_dir / "results.csv", csv);
  io::write_text_file(out_dir / "results.md", markdown);
  const json results{{"finished", result.finished},
                     {"provenance", result.provenance},
                     {"mode", result.mode},
                     {"keys", result.keys},
                     {"columns", result.columns},
                     {"rows", rows}};
  io::write_text_file(out_dir / "results.json", results.dump(2) + "\n");
  return markdown;
}

}  // namespace ltrain::bench
