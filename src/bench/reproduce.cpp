#include "ltrain/bench/reproduce.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/matmul_bench.h"
#include "ltrain/bench/step_bench.h"
#include "ltrain/bench/sweep.h"
#include "ltrain/config/load.h"
#include "ltrain/core/environment.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/data/cifar.h"
#include "ltrain/engine/setup.h"
#include "ltrain/io/provenance.h"
#include "ltrain/io/run_files.h"

namespace ltrain::bench {
namespace fs = std::filesystem;

const std::vector<Guide>& guides() {
  static const std::vector<Guide> all{
      {"RTX 5090 guide", "RTX 5090跑深度学习：新手入门指南与性能调优实战",
       "Deep learning on an RTX 5090: a beginner's guide and tuning in practice"},
      {"RTX 4090 guide", "如何充分利用4090显卡算力：从环境配置到深度学习实战指南",
       "Using all of an RTX 4090's compute: from set-up to deep learning in practice"},
      {"RTX 4090D guide", "NVIDIA 4090D算力实战指南：从环境搭建到深度学习模型部署",
       "The NVIDIA 4090D compute guide: from set-up to deploying deep-learning models"}};
  return all;
}

RatioSpread ratio_spread(const std::vector<double>& a, const std::vector<double>& b) {
  RatioSpread spread;
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) ratios.push_back(b[i] / a[i]);
  if (ratios.empty()) return spread;
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  spread.median = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  spread.low = ratios.front();
  spread.high = ratios.back();
  spread.rounds = static_cast<int>(n);
  return spread;
}

std::string verdict(const RatioSpread& spread, double claimed, Comparison comparison) {
  const bool every_round_meets = comparison == Comparison::at_least ? spread.low >= claimed : spread.high <= claimed;
  const bool no_round_meets = comparison == Comparison::at_least ? spread.high < claimed : spread.low > claimed;
  if (every_round_meets) return "holds";
  if (no_round_meets) return "does not hold";
  return fmt::format("undecided: the claimed {:.2f}x lies within the rounds' {:.2f}-{:.2f}x", claimed, spread.low,
                     spread.high);
}

double rounds_noise(const std::vector<double>& a, const std::vector<double>& b) {
  double noise = 0.0;
  for (const std::vector<double>* side : {&a, &b}) {
    if (side->size() < 2) continue;
    std::vector<double> sorted = *side;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double middle = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    if (middle > 0.0) noise = std::max(noise, (sorted.back() - sorted.front()) / middle);
  }
  return noise;
}

bool within_noise(double ratio, double reference, double noise) {
  return std::abs(ratio / reference - 1.0) < noise;
}

const PublishedCard* published_card(const std::string& gpu_name) {
  // NVIDIA's published figures. "RTX 4090 D" before "RTX 4090": the driver's names share the prefix.
  static const std::vector<PublishedCard> cards{
      {"NVIDIA GeForce RTX 5090", "Blackwell", 12, 0, 170, 21760, "32 GB GDDR7", "1,792 GB/s"},
      {"NVIDIA GeForce RTX 4090 D", "Ada Lovelace", 8, 9, 114, 14592, "24 GB GDDR6X", "1,008 GB/s"},
      {"NVIDIA GeForce RTX 4090", "Ada Lovelace", 8, 9, 128, 16384, "24 GB GDDR6X", "1,008 GB/s"},
      {"NVIDIA GeForce RTX 3090", "Ampere", 8, 6, 82, 10496, "24 GB GDDR6X", "936 GB/s"},
      {"NVIDIA H200", "Hopper", 9, 0, 132, 16896, "141 GB HBM3e", "4.8 TB/s"}};
  for (const PublishedCard& card : cards)
    if (gpu_name.rfind(card.name, 0) == 0) return &card;
  return nullptr;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const std::string kNoGuide = "none";  // a row of ltrain's own, beside the guides' claims

const std::string& guide_name(int index) { return guides().at(static_cast<size_t>(index)).name; }
const std::string& guide_5090() { return guide_name(0); }
const std::string& guide_4090() { return guide_name(1); }
const std::string& guide_4090d() { return guide_name(2); }

/// The architecture NVIDIA names for a compute capability.
std::string architecture(int major, int minor) {
  if (major == 7) return minor == 0 ? "Volta" : "Turing";
  if (major == 8) return minor == 9 ? "Ada Lovelace" : "Ampere";
  if (major == 9) return "Hopper";
  if (major >= 10) return "Blackwell";
  return "pre-Volta";
}

std::string percent(double fraction) { return fmt::format("{:.0f}%", 100.0 * fraction); }

/// 21760 -> "21,760".
std::string thousands(int64_t value) {
  std::string digits = std::to_string(value);
  for (auto at = static_cast<int64_t>(digits.size()) - 3; at > 0; at -= 3) digits.insert(static_cast<size_t>(at), ",");
  return digits;
}

std::string describe(const PublishedCard& card) {
  return fmt::format("{} ({}, compute capability {}.{}, {} SMs, {} CUDA cores, {} at {})", card.name, card.architecture,
                     card.major, card.minor, card.multiprocessors, thousands(card.cuda_cores), card.memory,
                     card.bandwidth);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// "28,281 img/s (27,902-28,400)": the median of the rounds and their range.
std::string with_range(const std::vector<double>& values, const std::string& format_one, const std::string& unit) {
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  const std::string middle = fmt::format(fmt::runtime(format_one), median(values));
  if (values.size() < 2) return middle + unit;
  return fmt::format("{}{} ({}-{})", middle, unit, fmt::format(fmt::runtime(format_one), *low),
                     fmt::format(fmt::runtime(format_one), *high));
}

/// One side of an A/B measurement: a name for the report and the keys it sets on the base config.
struct Variant {
  std::string name;
  std::vector<std::string> settings;
};

/// Step benchmarks of the base config with some keys changed, each (variant, image size, round)
/// run once and kept. A variant that fails is not tried again.
class Measurements {
 public:
  /// `earlier`: the "steps" measurements of an unfinished report continued (null: none), reused.
  Measurements(const ReproduceOptions& options, const config::LoadedConfig& base, const torch::Device& device,
               const nlohmann::json& earlier)
      : options_(options), base_(base), device_(device) {
    if (earlier.is_object()) reuse(earlier);
  }

  /// Called after each measurement (a round or a failure), when json() holds it.
  void after_each(std::function<void()> saved) { after_each_ = std::move(saved); }

  /// The measurements taken from the earlier report: "fp32 at 32x32 (2 rounds)".
  const std::vector<std::string>& reused() const { return reused_; }

  /// Round `round` of `variant` at `image_size`, or nullopt with `error()` saying why.
  const std::optional<StepBenchResult>& step(const Variant& variant, int64_t image_size, int64_t round) {
    const std::string key = fmt::format("{} at {}", variant.name, image_size);
    auto& rounds = results_[key];
    if (errors_.count(key)) return failed_;
    if (static_cast<int64_t>(rounds.size()) > round) return rounds[static_cast<size_t>(round)];
    std::vector<std::string> sets = options_.overrides;
    const std::vector<std::string> size_sets = image_size_settings(image_size);
    sets.insert(sets.end(), size_sets.begin(), size_sets.end());
    sets.insert(sets.end(), variant.settings.begin(), variant.settings.end());
    nlohmann::json& saved = json_[std::to_string(image_size)][variant.name];
    try {
      const StepBenchResult result =
          bench_steps(config::load_file(options_.base_config, sets), options_.warmup, options_.steps);
      saved["settings"] = variant.settings;
      saved["rounds"].push_back(to_json(result));
      spdlog::info("measured {} at {}x{}, round {}: {:.0f} img/s, {:.2f} ms/step", variant.name, image_size,
                   image_size, round + 1, result.images_per_second, result.ms_per_step);
      rounds.emplace_back(result);
      if (after_each_) after_each_();
      return rounds.back();
    } catch (const Interrupted&) {
      throw;
    } catch (const UserError& error) {
      errors_[key] = compat::first_line(error.what());
    } catch (const c10::Error& error) {
      errors_[key] = failure_text(error, device_);
    }
    saved = {{"settings", variant.settings}, {"error", errors_[key]}};
    spdlog::info("measured {} at {}x{}: failed: {}", variant.name, image_size, image_size, errors_[key]);
    if (after_each_) after_each_();
    return failed_;
  }

  std::string error(const Variant& variant, int64_t image_size) const {
    auto it = errors_.find(fmt::format("{} at {}", variant.name, image_size));
    return it == errors_.end() ? "" : it->second;
  }

  nlohmann::json& json() { return json_; }

 private:
  /// At the base config's own side, nothing; at another, random images of that side, enough of
  /// them for the largest batch measured (the pool's worth at least, so copies stay cheap).
  std::vector<std::string> image_size_settings(int64_t image_size) const {
    const config::DataSection& data = base_.config.data;
    if (image_size == data.image_size) return {};
    const int64_t largest_batch = data.batch_size * base_.config.optim.accumulation_steps;
    const int64_t images = std::max(data::synthetic_pool_images(image_size), 2 * largest_batch);
    return {"data.source=synthetic", fmt::format("data.image_size={}", image_size),
            fmt::format("data.synthetic_train_size={}", images),
            fmt::format("data.synthetic_test_size={}", std::min<int64_t>(images, data.eval_batch_size))};
  }

  /// Takes the rounds and failures of an earlier report's "steps" as measured here.
  void reuse(const nlohmann::json& earlier) {
    for (const auto& [size, variants] : earlier.items())
      for (const auto& [name, saved] : variants.items()) {
        const std::string key = fmt::format("{} at {}", name, size);
        if (saved.contains("error")) {
          errors_[key] = saved.at("error").get<std::string>();
          reused_.push_back(fmt::format("{} at {}x{} (failed)", name, size, size));
        } else {
          for (const nlohmann::json& round : saved.at("rounds")) results_[key].emplace_back(step_result_from_json(round));
          reused_.push_back(fmt::format("{} at {}x{} ({} round(s))", name, size, size, results_[key].size()));
        }
      }
    json_ = earlier;
  }

  const ReproduceOptions& options_;
  const config::LoadedConfig& base_;
  const torch::Device device_;
  std::function<void()> after_each_;
  std::vector<std::string> reused_;
  std::map<std::string, std::deque<std::optional<StepBenchResult>>> results_;  // a deque: results stay where they are
  std::map<std::string, std::string> errors_;
  std::optional<StepBenchResult> failed_;
  nlohmann::json json_ = nlohmann::json::object();
};

ClaimRow claim(const std::string& guide, const std::string& text, const std::string& quote, int64_t image_size = 0) {
  ClaimRow row;
  row.guide = guide;
  row.claim = text;
  row.quote = quote;
  row.image_size = image_size;
  return row;
}

ClaimRow not_measurable(ClaimRow row, const std::string& why) {
  row.verdict = "not measurable here: " + why;
  return row;
}

/// Both sides over every round (A then B in each), or the reason one could not be measured.
struct Rounds {
  std::vector<const StepBenchResult*> a;
  std::vector<const StepBenchResult*> b;
  std::string why_not;
};

Rounds measure_rounds(Measurements& m, const ReproduceOptions& options, int64_t image_size, const Variant& a,
                      const Variant& b) {
  Rounds rounds;
  for (int64_t round = 0; round < options.rounds; ++round) {
    const auto& base = m.step(a, image_size, round);
    if (!base) return {{}, {}, m.error(a, image_size)};
    const auto& changed = m.step(b, image_size, round);
    if (!changed) return {{}, {}, m.error(b, image_size)};
    rounds.a.push_back(&*base);
    rounds.b.push_back(&*changed);
  }
  return rounds;
}

template <class Field>
std::vector<double> values(const std::vector<const StepBenchResult*>& results, Field field) {
  std::vector<double> out;
  for (const StepBenchResult* r : results) out.push_back(static_cast<double>(field(*r)));
  return out;
}

double images_per_second(const StepBenchResult& r) { return r.images_per_second; }
double peak_memory(const StepBenchResult& r) { return static_cast<double>(r.peak_memory_bytes); }

/// "within noise (+4%, the rounds vary by 12%)": a difference smaller than the rounds' spread.
std::string noise_text(double ratio, double noise) {
  return fmt::format("within noise ({:+.0f}%, the rounds vary by {})", 100.0 * (ratio - 1.0), percent(noise));
}

/// B's time per image against A's, as a finding only where it exceeds the rounds' noise.
std::string time_paid_text(const RatioSpread& time_ratio, double noise) {
  if (time_ratio.rounds < 2)
    return fmt::format("time per image {:+.0f}% (one round: its noise is not measured)",
                       100.0 * (time_ratio.median - 1.0));
  if (within_noise(time_ratio.median, 1.0, noise)) return "time per image " + noise_text(time_ratio.median, noise);
  return fmt::format("time per image {:+.0f}%", 100.0 * (time_ratio.median - 1.0));
}

/// A throughput claim: B's images/s is at least `claimed` times A's (a NaN `claimed`: measured
/// only, no claim to hold it against).
ClaimRow speed_claim(Measurements& m, const ReproduceOptions& options, ClaimRow row, const Variant& a,
                     const Variant& b, double claimed) {
  const Rounds rounds = measure_rounds(m, options, row.image_size, a, b);
  if (!rounds.why_not.empty()) return not_measurable(row, rounds.why_not);
  const std::vector<double> a_rates = values(rounds.a, images_per_second);
  const std::vector<double> b_rates = values(rounds.b, images_per_second);
  row.ratio = ratio_spread(a_rates, b_rates);
  row.claimed = claimed;
  row.measured = fmt::format("{}: {}, {}: {}", b.name, with_range(b_rates, "{:.0f}", " img/s"), a.name,
                             with_range(a_rates, "{:.0f}", " img/s"));
  const double noise = rounds_noise(a_rates, b_rates);
  if (std::isnan(claimed)) {
    row.verdict = "measured";
    if (within_noise(row.ratio.median, 1.0, noise)) row.measured += "; " + noise_text(row.ratio.median, noise);
    return row;
  }
  row.verdict = verdict(row.ratio, claimed, Comparison::at_least);
  if (row.verdict.rfind("undecided", 0) != 0 && within_noise(row.ratio.median, claimed, noise))
    row.verdict = fmt::format("undecided: {:.2f}x against the claimed {:.2f}x is within the rounds' noise ({})",
                              row.ratio.median, claimed, percent(noise));
  return row;
}

/// A memory claim: B's peak is at most (1 - `claimed_saving`) of A's; the time paid is reported too.
ClaimRow memory_claim(Measurements& m, const ReproduceOptions& options, ClaimRow row, const Variant& a,
                      const Variant& b, double claimed_saving) {
  const Rounds rounds = measure_rounds(m, options, row.image_size, a, b);
  if (!rounds.why_not.empty()) return not_measurable(row, rounds.why_not);
  const std::vector<double> a_rates = values(rounds.a, images_per_second);
  const std::vector<double> b_rates = values(rounds.b, images_per_second);
  const RatioSpread time_ratio = ratio_spread(b_rates, a_rates);
  const std::string time_paid = time_paid_text(time_ratio, rounds_noise(a_rates, b_rates));
  if (rounds.a.front()->peak_memory_bytes < 0) {
    row.measured = fmt::format("{} ({} vs {})", time_paid, b.name, a.name);
    return not_measurable(row, "peak memory is measured on CUDA devices");
  }
  const std::vector<double> a_bytes = values(rounds.a, peak_memory);
  const std::vector<double> b_bytes = values(rounds.b, peak_memory);
  row.ratio = ratio_spread(a_bytes, b_bytes);
  row.claimed = 1.0 - claimed_saving;
  row.measured = fmt::format("peak {:.2f} GiB ({}) vs {:.2f} GiB ({}): {} less; {}", median(b_bytes) / kGiB, b.name,
                             median(a_bytes) / kGiB, a.name, percent(1.0 - row.ratio.median), time_paid);
  row.verdict = verdict(row.ratio, row.claimed, Comparison::at_most);
  return row;
}

/// Precision settings, each set in full so that no variant depends on the base config's.
std::vector<std::string> precision(const std::string& mode, bool tf32, bool cudnn_benchmark = true) {
  return {"precision.mode=" + mode, fmt::format("precision.tf32={}", tf32),
          fmt::format("precision.cudnn_benchmark={}", cudnn_benchmark), "cuda_graph.train=false"};
}

std::vector<std::string> plus(std::vector<std::string> settings, const std::vector<std::string>& more) {
  settings.insert(settings.end(), more.begin(), more.end());
  return settings;
}

/// The precision of the claims that compare no precisions: the guides' fp16 where the device has it
/// (CUDA), else the base config's.
std::string unpaired_precision(const config::LoadedConfig& base, const torch::Device& device) {
  return device.is_cuda() ? "fp16" : config::to_string(base.config.precision.mode);
}

/// The claims measured by A/B step benchmarks, at one image size.
void image_claims(Measurements& m, const ReproduceOptions& options, const config::LoadedConfig& base,
                  const torch::Device& device, int64_t size, std::vector<ClaimRow>& rows) {
  const std::string mode = unpaired_precision(base, device);
  const Variant fp32{"fp32", precision("fp32", false)};
  const Variant fp16{"fp16", precision("fp16", false)};
  const Variant fp16_tf32{"fp16 + TF32", precision("fp16", true)};
  const Variant tf32{"tf32", precision("tf32", true)};

  rows.push_back(speed_claim(
      m, options,
      claim(guide_4090(), "AMP (fp16 autocast with a GradScaler) trains ResNet-50 2-3x faster than FP32",
            "效果：ResNet50 训练速度提升 2 - 3 倍，显存占用减少 30%", size),
      fp32, fp16, 2.0));
  rows.push_back(memory_claim(m, options,
                              claim(guide_4090(), "AMP uses 30% less memory than FP32",
                                    "效果：ResNet50 训练速度提升 2 - 3 倍，显存占用减少 30%", size),
                              fp32, fp16, 0.30));
  rows.push_back(speed_claim(
      m, options, claim(guide_4090d(), "FP16 mixed precision trains 2-3x faster", "FP16 可提升 2 - 3 倍速度", size),
      fp32, fp16, 2.0));
  rows.push_back(speed_claim(m, options,
                             claim(guide_5090(), "FP16 and TF32 together give 3x the throughput",
                                   "同时使用 FP16 和 TF32 计算，吞吐量可提升 3 倍", size),
                             fp32, fp16_tf32, 3.0));
  rows.push_back(speed_claim(m, options,
                             claim(guide_4090d(), "TF32 matmuls and convolutions speed up FP32 training",
                                   "torch.backends.cudnn.allow_tf32 = True", size),
                             fp32, tf32, 1.0));
  rows.push_back(speed_claim(m, options,
                             claim(guide_4090d(), "cudnn.benchmark (autotuned convolution algorithms) speeds training up",
                                   "torch.backends.cudnn.benchmark = True  # 启用自动优化", size),
                             {"fp16, cudnn.benchmark off", precision("fp16", false, false)}, fp16, 1.0));
  rows.push_back(speed_claim(
      m, options, claim(guide_4090(), "replaying a CUDA graph is 15% faster than eager execution",
                        "g.replay()  # 比常规执行快 15%", size),
      fp16, {"fp16 + CUDA graph", plus(precision("fp16", false), {"cuda_graph.train=true"})}, 1.15));

  // Gradient accumulation: the same images per step in 4 micro-batches.
  const int64_t batch = base.config.data.batch_size * base.config.optim.accumulation_steps;
  const int64_t micro = std::max<int64_t>(1, batch / 4);
  const Variant whole{fmt::format("batch {}", batch),
                      plus(precision(mode, false), {fmt::format("data.batch_size={}", batch),
                                                    "optim.accumulation_steps=1"})};
  const Variant split{fmt::format("{} x {} accumulated", batch / micro, micro),
                      plus(precision(mode, false), {fmt::format("data.batch_size={}", micro),
                                                    fmt::format("optim.accumulation_steps={}", batch / micro)})};
  const std::string accumulation =
      fmt::format("accumulating 4 batches reaches a large batch ({} images) in less memory", batch);
  rows.push_back(memory_claim(m, options, claim(guide_5090(), accumulation, "# 每 4 个 batch 更新一次参数", size),
                              whole, split, 1e-9));
  rows.push_back(memory_claim(
      m, options, claim(guide_4090(), accumulation, "accum_steps = 4  # 累积 4 个 batch 再更新", size), whole, split,
      1e-9));

  const Variant no_checkpointing{"no checkpointing", plus(precision(mode, false), {"model.checkpoint_segments=0"})};
  const Variant four_segments{"4 segments", plus(precision(mode, false), {"model.checkpoint_segments=4"})};
  rows.push_back(memory_claim(
      m, options,
      claim(guide_5090(), "activation checkpointing (checkpoint_sequential, 4 chunks) saves memory when it runs out",
            "model = torch.utils.checkpoint.checkpoint_sequential(model, chunks=4)", size),
      no_checkpointing, four_segments, 1e-9));
  rows.push_back(memory_claim(m, options,
                              claim(guide_4090(), "gradient checkpointing saves memory when it runs out",
                                    "使用梯度检查点（torch.utils.checkpoint）", size),
                              no_checkpointing, four_segments, 1e-9));

  rows.push_back(speed_claim(
      m, options,
      claim(kNoGuide,
            fmt::format("channels_last memory format under {} (no guide says it; fp16's speed-up depends on it)", mode),
            "", size),
      {mode + " NCHW", plus(precision(mode, false), {"model.channels_last=false"})},
      {mode + " channels_last", plus(precision(mode, false), {"model.channels_last=true"})},
      std::numeric_limits<double>::quiet_NaN()));
}

/// The 4090D guide's batch-size search: from 256 (so that the guide's 512 is a point), doubling
/// until 90% of the memory is used; fp16 with the whole step graphed, ltrain's fastest step.
ClaimRow batch_search(const ReproduceOptions& options, const config::LoadedConfig& base, const torch::Device& device,
                      const fs::path& out_dir) {
  ClaimRow search = claim(guide_4090d(), "grow the batch from 512 until memory use reaches 90%",
                          "从 512 开始尝试，逐步增加直到显存占用达 90%");
  if (!device.is_cuda() || !options.batch_search)
    return not_measurable(search, device.is_cuda() ? "skipped (--no-batch-search)" : "the search measures GPU memory");
  // Steps at the large batches take up to a second: fewer of them time it well.
  constexpr int64_t kLargestBatch = 262144;
  constexpr double kFraction = 0.9;  // the guide's
  const int64_t warmup = std::max(std::min<int64_t>(options.warmup, 6), base.config.cuda_graph.warmup_steps + 1);
  nlohmann::json sweep{
      {"base", fs::absolute(options.base_config).string()},
      {"set", options.overrides},
      {"mode", "bench"},
      {"bench", {{"warmup", warmup}, {"steps", std::min<int64_t>(options.steps, 12)}, {"rounds", 1}}},
      {"batch_search", {{"start", 256}, {"factor", 2}, {"memory_fraction", kFraction}, {"max", kLargestBatch}}}};
  sweep["set"].push_back("precision.mode=fp16");
  sweep["set"].push_back("cuda_graph.train=true");
  if (base.config.data.source == config::DataSource::synthetic)
    sweep["set"].push_back(fmt::format("data.synthetic_train_size={}", kLargestBatch));
  const fs::path sweep_dir = out_dir / "batch-search";
  fs::create_directories(sweep_dir);
  io::write_text_file(sweep_dir / "sweep.json", sweep.dump(2) + "\n");
  // Writes its results files as it goes; a rerun reuses the batches measured.
  const SweepResult result = run_sweep(sweep_dir / "sweep.json", sweep_dir, {}, options.fresh);
  // The largest batch under 90%, and the smallest past it (or out of memory), over every point.
  const SweepPoint* best = nullptr;
  const SweepPoint* past = nullptr;
  const auto batch_of = [](const SweepPoint& point) { return point.settings.back().second.get<int64_t>(); };
  for (const SweepPoint& point : result.points) {
    const bool under =
        point.error.empty() && point.values.count("memory_fraction") && point.values.at("memory_fraction") <= kFraction;
    const SweepPoint*& slot = under ? best : past;
    if (!slot || (under ? batch_of(point) > batch_of(*slot) : batch_of(point) < batch_of(*slot))) slot = &point;
  }
  if (!best) return not_measurable(search, result.points.empty() ? "no point ran" : result.points.front().error);
  const std::string past_text =
      !past ? "none past 90% up to the search's maximum"
            : fmt::format("the smallest past 90%: batch {} ({})", batch_of(*past),
                          past->error.empty() ? percent(past->values.at("memory_fraction")) + " reserved" : past->error);
  search.measured = fmt::format(
      "batch {} (fp16, CUDA graph) is the largest under 90%: {:.0f} img/s, {} of the GPU reserved; {} point(s), {}",
      batch_of(*best), best->values.at("img_per_s"), percent(best->values.at("memory_fraction")),
      result.points.size(), past_text);
  search.verdict = "measured";
  return search;
}

/// The guides' statements about cards, set against the published figures and this device.
void hardware_claims(const std::optional<env::Gpu>& gpu, const std::string& device, std::vector<ClaimRow>& rows) {
  const PublishedCard* here = gpu ? published_card(gpu->name) : nullptr;
  // What the driver says of this device, and what NVIDIA publishes for it where it is known.
  std::string this_device = "this device: " + device;
  if (here) this_device += "; published: " + describe(*here);
  if (gpu) this_device += fmt::format("; the driver reports {} SMs", gpu->multiprocessors);
  const auto card_row = [&](const std::string& guide, const std::string& text, const std::string& quote,
                            const std::string& card_name, const std::string& correction) {
    ClaimRow row = claim(guide, text, quote);
    const PublishedCard& card = *published_card(card_name);
    row.verdict = "wrong: " + correction;
    row.measured = here == &card ? fmt::format("this device is one: {} ({} SMs, {:.1f} GiB, compute capability {}.{})",
                                               gpu->name, gpu->multiprocessors,
                                               static_cast<double>(gpu->memory_bytes) / kGiB, gpu->major, gpu->minor)
                                 : this_device;
    rows.push_back(row);
  };
  card_row(guide_5090(), "the RTX 5090 is an Ada Lovelace card with 24 GB of GDDR6X at 1 TB/s",
           "采用 Ada Lovelace 架构 / 24GB GDDR6X 显存，带宽达 1TB/s", "NVIDIA GeForce RTX 5090",
           "published: " + describe(*published_card("NVIDIA GeForce RTX 5090")));
  card_row(guide_5090(), "CUDA 12.2 is the first CUDA to support the RTX 5090",
           "推荐 CUDA 12.2 及以上版本，这是首个原生支持 5090 的 CUDA 版本", "NVIDIA GeForce RTX 5090",
           "CUDA 12.8 is the first with code for compute capability 12.0 (sm_120)");
  card_row(guide_4090d(), "the RTX 4090D has 16,384 CUDA cores in 128 SMs",
           "CUDA 核心数量：16384 个 / SM 单元：128 个流式多处理器", "NVIDIA GeForce RTX 4090 D",
           "those are the RTX 4090's; published: " + describe(*published_card("NVIDIA GeForce RTX 4090 D")));
  const std::string no_nvlink = "GeForce cards of the RTX 40 and 50 series have no NVLink; they talk over PCIe";
  card_row(guide_5090(), "RTX 5090s scale over NVLink", "如何利用 5090 的 NVLink 实现高效多卡训练？",
           "NVIDIA GeForce RTX 5090", no_nvlink);
  card_row(guide_4090d(), "RTX 4090Ds scale over NVLink", "在分布式训练场景下，4090D 的 NVLink 带宽如何影响多卡扩展效率？",
           "NVIDIA GeForce RTX 4090 D", no_nvlink);
  rows.push_back(not_measurable(claim(guide_4090d(), "the RTX 4090D trains ResNet-50 about 40% faster than an RTX 3090",
                                      "4090D 相比 3090 训练速度提升约 40%"),
                                "it needs an RTX 4090D and an RTX 3090 side by side"));
}

/// The "steps" measurements of the unfinished report in `out_dir` made with `settings`, null where
/// there is none (no report, a finished one, one that cannot be read back: then a warning).
/// ConfigError for an unfinished report of other settings: it is kept unless asked otherwise.
nlohmann::json earlier_steps(const fs::path& out_dir, const nlohmann::json& settings) {
  const fs::path file = out_dir / "results.json";
  if (!files::not_a_regular_file(file).empty()) return nullptr;
  nlohmann::json earlier;
  try {
    const files::TextRead read = files::read_regular_file(file, 256u << 20);
    if (!read.problem.empty()) throw std::runtime_error(read.problem);
    earlier = nlohmann::json::parse(read.text);
    if (earlier.value("finished", true)) return nullptr;
    if (earlier.at("settings") == settings) {
      const nlohmann::json steps = earlier.at("measurements").value("steps", nlohmann::json::object());
      for (const auto& [size, variants] : steps.items())
        for (const auto& [name, saved] : variants.items())
          if (!saved.contains("error"))
            for (const nlohmann::json& round : saved.at("rounds")) step_result_from_json(round);  // readable
      return steps;
    }
  } catch (const std::exception& error) {
    spdlog::warn("{}: cannot read the unfinished report back ({}); measuring everything again", file.string(),
                 compat::first_line(error.what()));
    return nullptr;
  }
  std::vector<std::string> differences;
  for (const auto& [key, value] : settings.items()) {
    const nlohmann::json before = earlier.at("settings").value(key, nlohmann::json());
    if (before != value) differences.push_back(fmt::format("{} {} before, {} now", key, before.dump(), value.dump()));
  }
  throw ConfigError(fmt::format("{} holds an unfinished report of other settings ({}); rerun with those settings to "
                                "continue it, add --fresh to replace it, or choose another --out",
                                out_dir.string(), fmt::join(differences, "; ")));
}

/// " with `--set a=1 --set b=2`", or "" without overrides.
std::string set_flags(const std::vector<std::string>& overrides) {
  std::string flags;
  for (const std::string& set : overrides) flags += " --set " + set;
  return flags.empty() ? "" : fmt::format(" with `{}`", flags.substr(1));
}

std::string setup_text(const ReproduceOptions& options, const config::LoadedConfig& base, const torch::Device& device,
                       const std::vector<int64_t>& sizes) {
  const config::RunConfig& c = base.config;
  std::string size_list;
  for (const int64_t size : sizes) size_list += fmt::format("{}{}x{}", size_list.empty() ? "" : ", ", size, size);
  return fmt::format(
      "Base config: `{}`{}. Model: {} ({} stem, {} classes, channels_last {}). Images: {} ({}), measured at {}. "
      "Batch {}, {} with lr {}. Each claim sets the precisions it compares; the others run under {}. {} untimed and {} "
      "timed steps per measurement, {} round(s) of A then B per claim.",
      options.base_config.string(),
      set_flags(options.overrides),
      config::to_string(c.model.arch), config::to_string(c.model.stem), c.model.num_classes,
      c.model.channels_last ? "on" : "off", config::to_string(c.data.source),
      c.data.source == config::DataSource::synthetic ? "random pixels" : "the training set", size_list,
      c.data.batch_size, config::to_string(c.optim.name), c.optim.lr,
      unpaired_precision(base, device),
      options.warmup, options.steps, options.rounds);
}

}  // namespace

ReproduceReport reproduce(const ReproduceOptions& options, const fs::path& out_dir) {
  const auto started = std::chrono::system_clock::now();
  const config::LoadedConfig base = config::load_file(options.base_config, options.overrides);
  const torch::Device device = engine::resolve_device(base);
  files::create_results_folder(out_dir, "--out");
  const env::Environment environment = env::probe();
  ReproduceReport report;
  report.provenance = io::provenance(base.files, config::to_json(base.config), started);
  std::optional<env::Gpu> gpu;
  if (device.is_cuda()) gpu = environment.gpus.at(static_cast<size_t>(device.index()));
  report.device = gpu ? fmt::format("{} ({:.1f} GiB, compute capability {}.{}, {})", gpu->name,
                                    static_cast<double>(gpu->memory_bytes) / kGiB, gpu->major, gpu->minor,
                                    architecture(gpu->major, gpu->minor))
                      : fmt::format("the CPU ({} threads)", environment.cpu_threads);
  std::vector<int64_t> sizes = options.image_sizes;
  if (sizes.empty()) sizes.push_back(base.config.data.image_size);
  report.image_sizes = sizes;
  report.setup = setup_text(options, base, device, sizes);
  report.settings = {{"config_sha256", report.provenance.at("config_sha256")},
                     {"config_files", base.files},
                     {"overrides", options.overrides},
                     {"warmup", options.warmup},
                     {"steps", options.steps},
                     {"rounds", options.rounds},
                     {"image_sizes", sizes},
                     {"matmul_size", options.matmul_size},
                     {"matmul_products", options.matmul_products},
                     {"batch_search", options.batch_search},
                     {"device", report.device}};

  Measurements m(options, base, device, options.fresh ? nlohmann::json() : earlier_steps(out_dir, report.settings));
  report.reused = m.reused();
  if (!report.reused.empty())
    spdlog::info("{}: continuing the unfinished report of these settings; reused {} measurement(s): {} (--fresh "
                 "measures everything again)",
                 out_dir.string(), report.reused.size(), fmt::join(report.reused, ", "));
  // The report so far, after every measurement: a run cut short keeps what it measured.
  const auto save_progress = [&] {
    report.measurements["steps"] = m.json();
    write_report(report, out_dir);
  };
  m.after_each(save_progress);
  save_progress();
  for (const int64_t size : sizes) image_claims(m, options, base, device, size, report.rows);

  // The matmul test, one row per precision.
  const std::vector<MatmulResult> matmuls =
      bench_matmul(device,
                   {config::PrecisionMode::fp32, config::PrecisionMode::tf32, config::PrecisionMode::fp16,
                    config::PrecisionMode::bf16},
                   options.matmul_size, 10, options.matmul_products);
  report.measurements["matmul"] = nlohmann::json::array();
  for (const MatmulResult& r : matmuls) {
    report.measurements["matmul"].push_back(to_json(r));
    ClaimRow row = claim(guide_4090(),
                         fmt::format("matmul TFLOPS test (n = {}, {} timed products), {}", r.n, r.products, r.precision),
                         "print(f\"TFLOPS: {2*size**3*100/(time.time()-start)/1e12:.2f}\")");
    if (!r.error.empty()) {
      report.rows.push_back(not_measurable(row, r.error));
      continue;
    }
    row.measured = fmt::format("{:.4g} TFLOP/s ({:.3f} ms per product)", r.tflops, r.ms_per_product);
    row.verdict = "measured";
    report.rows.push_back(row);
  }
  save_progress();

  report.rows.push_back(batch_search(options, base, device, out_dir));
  hardware_claims(gpu, report.device, report.rows);
  report.measurements["steps"] = m.json();
  report.finished = true;
  return report;
}

namespace {

nlohmann::json number_or_null(double value) { return std::isnan(value) ? nlohmann::json(nullptr) : nlohmann::json(value); }

std::string ratio_text(const RatioSpread& ratio) {
  if (std::isnan(ratio.median)) return "";
  if (ratio.rounds < 2) return fmt::format("{:.2f}x", ratio.median);
  return fmt::format("{:.2f}x ({:.2f}-{:.2f})", ratio.median, ratio.low, ratio.high);
}

/// "2 x NVIDIA H200, NVIDIA L4" from the provenance's list of GPU names; "none" for none.
std::string gpu_names_text(const nlohmann::json& names) {
  std::vector<std::pair<std::string, int>> counted;
  for (const nlohmann::json& name : names) {
    const std::string text = name.get<std::string>();
    if (!counted.empty() && counted.back().first == text) {
      ++counted.back().second;
    } else {
      counted.emplace_back(text, 1);
    }
  }
  std::string out;
  for (const auto& [name, count] : counted)
    out += (out.empty() ? "" : ", ") + (count > 1 ? fmt::format("{} x {}", count, name) : name);
  return out.empty() ? "none" : out;
}

/// REPORT.md's lines on where its numbers come from: the provenance record and the image sizes.
std::string provenance_text(const nlohmann::json& p, const std::vector<int64_t>& image_sizes) {
  if (p.is_null()) return fmt::format("- ltrain {}; LibTorch {}\n", LTRAIN_VERSION, compat::torch_version());
  const std::vector<std::string> files = p.at("config_files").get<std::vector<std::string>>();
  std::string base = files.empty() ? "none" : fmt::format("`{}`", files.front());
  if (files.size() > 1) {
    std::string extended;
    for (size_t i = 1; i < files.size(); ++i) extended += fmt::format("{}`{}`", i > 1 ? ", " : "", files[i]);
    base += fmt::format(" (extends {})", extended);
  }
  std::string sizes;
  for (const int64_t size : image_sizes) sizes += fmt::format("{}{}x{}", sizes.empty() ? "" : ", ", size, size);
  const nlohmann::json& hash = p.at("config_sha256");
  return fmt::format(
      "- ltrain {}, commit {}; LibTorch {}, CUDA {}, cuDNN {}, NCCL {}\n"
      "- GPUs: {}; NVIDIA driver {}\n"
      "- Base config: {}; SHA-256 of the resolved config: {}\n"
      "- Image sizes: {}\n"
      "- Host {}, started {}\n",
      p.at("ltrain_version").get<std::string>(), p.at("source_commit").get<std::string>(),
      p.at("libtorch").get<std::string>(), p.at("cuda").get<std::string>(), p.at("cudnn").get<std::string>(),
      p.at("nccl").get<std::string>(), gpu_names_text(p.at("gpus")), p.at("nvidia_driver").get<std::string>(), base,
      hash.is_string() ? fmt::format("`{}`", hash.get<std::string>()) : "none", sizes.empty() ? "none" : sizes,
      p.at("host").get<std::string>(), p.at("started_at").get<std::string>());
}

std::string table_row(const ClaimRow& row) {
  const std::string quote = row.quote.empty() ? "" : fmt::format(": “{}”", row.quote);
  return fmt::format("| {} | {}{} | {} | {} | {} |\n", row.claim, row.guide, quote, row.measured, ratio_text(row.ratio),
                     row.verdict);
}

}  // namespace

std::string write_report(const ReproduceReport& report, const fs::path& out_dir) {
  fs::create_directories(out_dir);
  // The tables: the A/B step claims per image size, then the matmul test, the batch search and the cards.
  std::map<int64_t, std::string> step_tables;
  std::string other_table;
  nlohmann::json rows = nlohmann::json::array();
  for (const ClaimRow& row : report.rows) {
    (row.image_size > 0 ? step_tables[row.image_size] : other_table) += table_row(row);
    rows.push_back({{"claim", row.claim},
                    {"guide", row.guide},
                    {"quote", row.quote},
                    {"image_size", row.image_size},
                    {"measured", row.measured},
                    {"ratio", number_or_null(row.ratio.median)},
                    {"ratio_low", number_or_null(row.ratio.low)},
                    {"ratio_high", number_or_null(row.ratio.high)},
                    {"rounds", row.ratio.rounds},
                    {"claimed_ratio", number_or_null(row.claimed)},
                    {"verdict", row.verdict}});
  }
  std::string text = fmt::format("# The guides' claims, measured\n\n{}Device: {}.\n\n{}\n{}\n\n",
                                 report.finished ? ""
                                                 : "**Unfinished**: the measurements below are those made so far; "
                                                   "the same command continues them.\n\n",
                                 report.device, provenance_text(report.provenance, report.image_sizes), report.setup);
  text += "The guides:\n\n";
  for (const Guide& guide : guides()) text += fmt::format("- **{}**: {} ({})\n", guide.name, guide.title, guide.about);
  text += "\nRatios are B over A (images/s for speed claims, peak memory for memory claims): the median of the "
          "rounds and, in brackets, their range. A claim holds when every round meets it, does not hold when none "
          "does, and is undecided when the claimed ratio lies within the rounds' range. Plots: `python3 "
          "scripts/report/plot_report.py DIR` draws claims.png; the batch search's sweep is in batch-search/ (`python3 "
          "scripts/report/plot_sweep.py DIR/batch-search`).\n";
  const std::string header = "\n| claim | guide and line | measured here | ratio | verdict |\n|---|---|---|---|---|\n";
  for (const auto& [size, table] : step_tables)
    text += fmt::format("\n## Training steps at {0}x{0}\n", size) + header + table;
  text += "\n## The matmul test, the batch search and the cards\n" + header + other_table;
  io::write_text_file(out_dir / "REPORT.md", text);
  io::write_text_file(out_dir / "results.json",
                      nlohmann::json{{"finished", report.finished},
                                     {"settings", report.settings},
                                     {"reused", report.reused},
                                     {"provenance", report.provenance},
                                     {"image_sizes", report.image_sizes},
                                     {"device", report.device},
                                     {"setup", report.setup},
                                     {"claims", rows},
                                     {"measurements", report.measurements}}
                              .dump(2) +
                          "\n");
  return text;
}

}  // namespace ltrain::bench
