#include "ltrain/bench/reproduce.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/matmul_bench.h"
#include "ltrain/bench/step_bench.h"
#include "ltrain/bench/sweep.h"
#include "ltrain/config/load.h"
#include "ltrain/core/environment.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/io/run_files.h"

namespace ltrain::bench {
namespace {
namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kSomeGuide = "the GPU guides";  // the issue quotes these without naming the guide

/// The architecture NVIDIA names for a compute capability.
std::string architecture(int major, int minor) {
  if (major == 7) return minor == 0 ? "Volta" : "Turing";
  if (major == 8) return minor == 9 ? "Ada" : "Ampere";
  if (major == 9) return "Hopper";
  if (major >= 10) return "Blackwell";
  return "pre-Volta";
}

std::string percent(double fraction) { return fmt::format("{:.0f}%", 100.0 * fraction); }

/// Step benchmarks of the base config with some keys changed, each run once and kept by name.
class Measurements {
 public:
  explicit Measurements(const ReproduceOptions& options) : options_(options) {}

  /// The result of `name` (the base config plus `extra`), or nullopt with `error()` saying why.
  const std::optional<StepBenchResult>& step(const std::string& name, const std::vector<std::string>& extra) {
    auto found = results_.find(name);
    if (found != results_.end()) return found->second;
    std::vector<std::string> sets = options_.overrides;
    sets.insert(sets.end(), extra.begin(), extra.end());
    std::optional<StepBenchResult> result;
    try {
      result = bench_steps(config::load_file(options_.base_config, sets), options_.warmup, options_.steps);
      json_[name] = to_json(*result);
      spdlog::info("measured {}: {:.0f} img/s, {:.2f} ms/step", name, result->images_per_second, result->ms_per_step);
    } catch (const UserError& error) {
      errors_[name] = compat::first_line(error.what());
    } catch (const c10::Error& error) {
      errors_[name] = compat::failure_summary(error);
    }
    if (errors_.count(name)) {
      json_[name] = {{"settings", extra}, {"error", errors_[name]}};
      spdlog::info("measured {}: failed: {}", name, errors_[name]);
    }
    return results_.emplace(name, result).first->second;
  }

  std::string error(const std::string& name) const {
    auto it = errors_.find(name);
    return it == errors_.end() ? "" : it->second;
  }

  nlohmann::json& json() { return json_; }

 private:
  const ReproduceOptions& options_;
  std::map<std::string, std::optional<StepBenchResult>> results_;
  std::map<std::string, std::string> errors_;
  nlohmann::json json_ = nlohmann::json::object();
};

ClaimRow claim(const std::string& text, const std::string& guide) {
  ClaimRow row;
  row.claim = text;
  row.guide = guide;
  return row;
}

ClaimRow not_measurable(ClaimRow row, const std::string& why) {
  row.verdict = "not measurable here: " + why;
  return row;
}

/// One side of an A/B measurement: a name for the report and the keys it changes.
struct Variant {
  std::string name;
  std::vector<std::string> settings;
};

/// Both sides measured, or the reason one could not be (then both pointers are null).
struct Pair {
  const StepBenchResult* base = nullptr;     // A
  const StepBenchResult* changed = nullptr;  // B
  std::string why_not;
};

Pair measure_pair(Measurements& m, const Variant& a, const Variant& b) {
  const auto& base = m.step(a.name, a.settings);
  const auto& changed = m.step(b.name, b.settings);
  if (!base) return {nullptr, nullptr, m.error(a.name)};
  if (!changed) return {nullptr, nullptr, m.error(b.name)};
  return {&*base, &*changed, ""};
}

/// A throughput claim: B is at least `claimed` times A.
ClaimRow speed_claim(Measurements& m, ClaimRow row, const Variant& a, const Variant& b, double claimed) {
  const Pair pair = measure_pair(m, a, b);
  if (!pair.base) return not_measurable(row, pair.why_not);
  row.ratio = pair.changed->images_per_second / pair.base->images_per_second;
  row.claimed = claimed;
  row.measured = fmt::format("{}: {:.0f} img/s, {}: {:.0f} img/s", b.name, pair.changed->images_per_second, a.name,
                             pair.base->images_per_second);
  row.verdict = row.ratio >= claimed ? "holds" : "does not hold";
  return row;
}

/// A memory claim: B's peak is at least `claimed_saving` below A's; the time paid is reported too.
ClaimRow memory_claim(Measurements& m, ClaimRow row, const Variant& a, const Variant& b, double claimed_saving) {
  const Pair pair = measure_pair(m, a, b);
  if (!pair.base) return not_measurable(row, pair.why_not);
  const double time_paid = pair.base->images_per_second / pair.changed->images_per_second - 1.0;
  if (pair.base->peak_memory_bytes < 0) {
    row.measured = fmt::format("time per image {:+.0f}% ({} vs {})", 100.0 * time_paid, b.name, a.name);
    return not_measurable(row, "peak memory is measured on CUDA devices");
  }
  const auto base_bytes = static_cast<double>(pair.base->peak_memory_bytes);
  const auto changed_bytes = static_cast<double>(pair.changed->peak_memory_bytes);
  row.ratio = changed_bytes / base_bytes;
  row.claimed = 1.0 - claimed_saving;
  row.measured = fmt::format("peak {:.2f} GiB ({}) vs {:.2f} GiB ({}): {} less; time per image {:+.0f}%",
                             changed_bytes / kGiB, b.name, base_bytes / kGiB, a.name, percent(1.0 - row.ratio),
                             100.0 * time_paid);
  row.verdict = 1.0 - row.ratio >= claimed_saving ? "holds" : "does not hold";
  return row;
}

}  // namespace

ReproduceReport reproduce(const ReproduceOptions& options, const fs::path& out_dir) {
  const config::LoadedConfig base = config::load_file(options.base_config, options.overrides);
  const torch::Device device = engine::resolve_device(base);
  const env::Environment environment = env::probe();
  ReproduceReport report;
  std::optional<env::Gpu> gpu;
  if (device.is_cuda()) gpu = environment.gpus.at(static_cast<size_t>(device.index()));
  report.device = gpu ? fmt::format("{} ({:.1f} GiB, compute capability {}.{}, {})", gpu->name,
                                    static_cast<double>(gpu->memory_bytes) / kGiB, gpu->major, gpu->minor,
                                    architecture(gpu->major, gpu->minor))
                      : fmt::format("the CPU ({} threads)", environment.cpu_threads);
  Measurements m(options);
  const Variant fp32{"fp32", {"precision.mode=fp32"}}, fp16{"fp16", {"precision.mode=fp16"}};

  report.rows.push_back(
      speed_claim(m, claim("AMP (fp16 autocast with a GradScaler) trains 2-3x faster than FP32", kSomeGuide), fp32, fp16, 2.0));
  report.rows.push_back(memory_claim(m, claim("AMP uses 30% less memory than FP32", kSomeGuide), fp32, fp16, 0.30));
  report.rows.push_back(speed_claim(m, claim("TF32 speeds up FP32 matmuls and convolutions on Ampere and newer", kSomeGuide),
                                    fp32, {"tf32", {"precision.mode=tf32"}}, 1.05));
  report.rows.push_back(speed_claim(m, claim("CUDA graphs make training 15% faster", kSomeGuide), fp16,
                                    {"fp16 + CUDA graph", {"precision.mode=fp16", "cuda_graph.train=true"}}, 1.15));

  // Gradient accumulation: the same images per step in 4 micro-batches.
  const int64_t batch = base.config.data.batch_size * base.config.optim.accumulation_steps;
  const int64_t micro = std::max<int64_t>(1, batch / 4);
  const Variant whole{fmt::format("batch {}", batch),
                      {fmt::format("data.batch_size={}", batch), "optim.accumulation_steps=1"}};
  const Variant split{fmt::format("{} x {} accumulated", batch / micro, micro),
                      {fmt::format("data.batch_size={}", micro), fmt::format("optim.accumulation_steps={}", batch / micro)}};
  report.rows.push_back(memory_claim(
      m,
      claim(fmt::format("gradient accumulation reaches the same effective batch ({} images) with less memory", batch),
            kSomeGuide),
      whole, split, 1e-9));
  report.rows.push_back(
      memory_claim(m, claim("activation checkpointing (checkpoint_sequential, 4 chunks) trades compute for memory", kSomeGuide),
                   {"no checkpointing", {"model.checkpoint_segments=0"}}, {"4 segments", {"model.checkpoint_segments=4"}},
                   1e-9));

  // The matmul test, one row per precision.
  const std::vector<MatmulResult> matmuls =
      bench_matmul(device,
                   {config::PrecisionMode::fp32, config::PrecisionMode::tf32, config::PrecisionMode::fp16,
                    config::PrecisionMode::bf16},
                   options.matmul_size, 10, options.matmul_products);
  report.measurements["matmul"] = nlohmann::json::array();
  for (const MatmulResult& r : matmuls) {
    report.measurements["matmul"].push_back(to_json(r));
    ClaimRow row = claim(fmt::format("matmul TFLOPS test (n = {}, {} timed products), {}", r.n, r.products, r.precision),
                         "4090 guide");
    if (!r.error.empty()) {
      report.rows.push_back(not_measurable(row, r.error));
      continue;
    }
    row.measured = fmt::format("{:.4g} TFLOP/s ({:.3f} ms per product)", r.tflops, r.ms_per_product);
    row.verdict = "measured";
    report.rows.push_back(row);
  }

  // The 4090D guide's batch-size search.
  ClaimRow search = claim("grow the batch from 512 until memory use reaches 90%", "4090D guide");
  if (!device.is_cuda() || !options.batch_search) {
    report.rows.push_back(not_measurable(search, device.is_cuda() ? "skipped (--no-batch-search)"
                                                                  : "the search measures GPU memory"));
  } else {
    // From 256, so the guide's 512 is one of the points; fp16 with the whole step graphed, ltrain's
    // fastest step. Steps at the large batches take up to a second: fewer of them time it well.
    constexpr int64_t kLargestBatch = 262144;
    constexpr double kFraction = 0.9;  // the guide's
    const int64_t warmup = std::max(std::min<int64_t>(options.warmup, 6), base.config.cuda_graph.warmup_steps + 1);
    nlohmann::json sweep{
        {"base", fs::absolute(options.base_config).string()},
        {"set", options.overrides},
        {"mode", "bench"},
        {"bench", {{"warmup", warmup}, {"steps", std::min<int64_t>(options.steps, 12)}}},
        {"batch_search", {{"start", 256}, {"factor", 2}, {"memory_fraction", kFraction}, {"max", kLargestBatch}}}};
    sweep["set"].push_back("precision.mode=fp16");
    sweep["set"].push_back("cuda_graph.train=true");
    if (base.config.data.source == config::DataSource::synthetic)
      sweep["set"].push_back(fmt::format("data.synthetic_train_size={}", kLargestBatch));
    const fs::path sweep_dir = out_dir / "batch-search";
    fs::create_directories(sweep_dir);
    io::write_text_file(sweep_dir / "sweep.json", sweep.dump(2) + "\n");
    const SweepResult result = run_sweep(sweep_dir / "sweep.json", sweep_dir);  // writes its results files
    // The largest batch under 90%, and the smallest past it (or out of memory), over every point.
    const SweepPoint* best = nullptr;
    const SweepPoint* past = nullptr;
    const auto batch_of = [](const SweepPoint& point) { return point.settings.back().second.get<int64_t>(); };
    for (const SweepPoint& point : result.points) {
      const bool under = point.error.empty() && point.values.count("memory_fraction") &&
                         point.values.at("memory_fraction") <= kFraction;
      const SweepPoint*& slot = under ? best : past;
      if (!slot || (under ? batch_of(point) > batch_of(*slot) : batch_of(point) < batch_of(*slot))) slot = &point;
    }
    if (!best) {
      report.rows.push_back(not_measurable(search, result.points.empty() ? "no point ran" : result.points.front().error));
    } else {
      const std::string past_text =
          !past ? "none past 90% up to the search's maximum"
                : fmt::format("the smallest past 90%: batch {} ({})", batch_of(*past),
                              past->error.empty() ? percent(past->values.at("memory_fraction")) + " reserved" : past->error);
      search.measured = fmt::format("batch {} (fp16, CUDA graph) is the largest under 90%: {:.0f} img/s, {} of the GPU reserved; {} point(s), "
                                    "{}",
                                    batch_of(*best), best->values.at("img_per_s"),
                                    percent(best->values.at("memory_fraction")), result.points.size(), past_text);
      search.verdict = "measured";
      report.rows.push_back(search);
    }
  }

  // The 5090 guide's hardware, beside this device.
  ClaimRow hardware = claim("the card has 24 GB of memory and the Ada architecture", "5090 guide");
  hardware.measured = "this device: " + report.device;
  const bool matches = gpu && gpu->major == 8 && gpu->minor == 9 &&
                       std::abs(static_cast<double>(gpu->memory_bytes) / 1e9 - 24.0) < 2.0;
  hardware.verdict = matches ? "holds for this device" : "differs from this device";
  report.rows.push_back(hardware);

  for (auto& [name, value] : m.json().items()) report.measurements["steps"][name] = value;
  return report;
}

std::string write_report(const ReproduceReport& report, const fs::path& out_dir) {
  fs::create_directories(out_dir);
  std::string text = fmt::format("# The guides' claims, measured\n\nDevice: {}. LibTorch {}, ltrain {}.\n\n",
                                 report.device, compat::torch_version(), LTRAIN_VERSION);
  text += "Ratios are B over A: images/s for speed claims, peak memory for memory claims. Plots: "
          "`python3 scripts/plot_report.py DIR` draws claims.png; the batch search's sweep is in batch-search/ "
          "(`python3 scripts/plot_sweep.py DIR/batch-search`).\n\n";
  text += "| claim | guide | measured here | ratio | verdict |\n|---|---|---|---|---|\n";
  nlohmann::json rows = nlohmann::json::array();
  for (const ClaimRow& row : report.rows) {
    const std::string ratio = std::isnan(row.ratio) ? "" : fmt::format("{:.2f}x", row.ratio);
    text += fmt::format("| {} | {} | {} | {} | {} |\n", row.claim, row.guide, row.measured, ratio, row.verdict);
    rows.push_back({{"claim", row.claim},
                    {"guide", row.guide},
                    {"measured", row.measured},
                    {"ratio", std::isnan(row.ratio) ? nlohmann::json(nullptr) : nlohmann::json(row.ratio)},
                    {"claimed_ratio", std::isnan(row.claimed) ? nlohmann::json(nullptr) : nlohmann::json(row.claimed)},
                    {"verdict", row.verdict}});
  }
  io::write_text_file(out_dir / "REPORT.md", text);
  io::write_text_file(out_dir / "results.json",
                      nlohmann::json{{"device", report.device}, {"claims", rows}, {"measurements", report.measurements}}
                              .dump(2) +
                          "\n");
  return text;
}

}  // namespace ltrain::bench
