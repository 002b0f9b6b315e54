#include "ltrain/bench/claim_runner.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/matmul_bench.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/data/cifar.h"

namespace ltrain::bench {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string percent(double fraction) { return fmt::format("{:.0f}%", 100.0 * fraction); }

/// "28,281 img/s (27,902-28,400)": the median of the rounds and their range.
std::string with_range(const std::vector<double>& values, const std::string& format_one, const std::string& unit) {
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  const std::string middle = fmt::format(fmt::runtime(format_one), median(values));
  if (values.size() < 2) return middle + unit;
  return fmt::format("{}{} ({}-{})", middle, unit, fmt::format(fmt::runtime(format_one), *low),
                     fmt::format(fmt::runtime(format_one), *high));
}

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

/// A throughput claim: B's images/s is at least claim.threshold times A's (NaN: measured only,
/// no claim to hold it against).
ClaimRow judge_speed(const Claim& claim, ClaimRow row, const SideRounds& a, const SideRounds& b) {
  const double claimed = claim.threshold;
  row.ratio = ratio_spread(a.images_per_second, b.images_per_second);
  row.claimed = claimed;
  row.measured = fmt::format("{}: {}, {}: {}", b.name, with_range(b.images_per_second, "{:.0f}", " img/s"), a.name,
                             with_range(a.images_per_second, "{:.0f}", " img/s"));
  const double noise = rounds_noise(a.images_per_second, b.images_per_second);
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

/// A memory claim: B's peak is at most (1 - claim.threshold) of A's; the time paid is reported too.
ClaimRow judge_memory(const Claim& claim, ClaimRow row, const SideRounds& a, const SideRounds& b) {
  const RatioSpread time_ratio = ratio_spread(b.images_per_second, a.images_per_second);
  const std::string time_paid = time_paid_text(time_ratio, rounds_noise(a.images_per_second, b.images_per_second));
  if (a.peak_bytes.empty() || a.peak_bytes.front() < 0) {
    row.measured = fmt::format("{} ({} vs {})", time_paid, b.name, a.name);
    return not_measurable(row, "peak memory is measured on CUDA devices");
  }
  row.ratio = ratio_spread(a.peak_bytes, b.peak_bytes);
  row.claimed = 1.0 - claim.threshold;
  row.measured = fmt::format("peak {:.2f} GiB ({}) vs {:.2f} GiB ({}): {} less; {}", median(b.peak_bytes) / kGiB,
                             b.name, median(a.peak_bytes) / kGiB, a.name, percent(1.0 - row.ratio.median), time_paid);
  row.verdict = verdict(row.ratio, row.claimed, Comparison::at_most);
  return row;
}

}  // namespace

ClaimRow not_measurable(ClaimRow row, const std::string& why) {
  row.verdict = "not measurable here: " + why;
  return row;
}

ClaimRow judge_step_claim(const Claim& claim, ClaimRow row, const SideRounds& a, const SideRounds& b) {
  if (claim.kind == ClaimKind::memory) return judge_memory(claim, std::move(row), a, b);
  return judge_speed(claim, std::move(row), a, b);
}

ClaimRow claim_row(const Claim& claim, const std::string& text, int64_t image_size) {
  ClaimRow row;
  row.guide = claim.guide;
  row.claim = text;
  row.quote = claim.quote;
  row.image_size = image_size;
  return row;
}

// ---- The step measurements --------------------------------------------------------------------

StepMeasurements::StepMeasurements(const ReproduceOptions& options, const config::LoadedConfig& base,
                                   const c10::Device& device, const nlohmann::json& earlier,
                                   const std::vector<Variant>& variants)
    : options_(options), base_(base), device_(device) {
  if (earlier.is_object()) reuse(earlier, variants);
}

const std::optional<StepBenchResult>& StepMeasurements::step(const Variant& variant, int64_t image_size,
                                                             int64_t round) {
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
    spdlog::info("measured {} at {}x{}, round {}: {:.0f} img/s, {:.2f} ms/step", variant.name, image_size, image_size,
                 round + 1, result.images_per_second, result.ms_per_step);
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

std::string StepMeasurements::error(const Variant& variant, int64_t image_size) const {
  auto it = errors_.find(fmt::format("{} at {}", variant.name, image_size));
  return it == errors_.end() ? "" : it->second;
}

/// At the base config's own side, nothing; at another, random images of that side, enough of
/// them for the largest batch measured (the pool's worth at least, so copies stay cheap).
std::vector<std::string> StepMeasurements::image_size_settings(int64_t image_size) const {
  const config::DataSection& data = base_.config.data;
  if (image_size == data.image_size) return {};
  const int64_t largest_batch = data.batch_size * base_.config.optim.accumulation_steps;
  const int64_t images = std::max(data::synthetic_pool_images(image_size), 2 * largest_batch);
  return {"data.source=synthetic", fmt::format("data.image_size={}", image_size),
          fmt::format("data.synthetic_train_size={}", images),
          fmt::format("data.synthetic_test_size={}", std::min<int64_t>(images, data.eval_batch_size))};
}

/// Takes the rounds and failures of an earlier report's "steps" as measured here, those of a
/// variant whose settings are the same now; the others (another claims file's) are measured again.
void StepMeasurements::reuse(const nlohmann::json& earlier, const std::vector<Variant>& variants) {
  for (const auto& [size, saved_variants] : earlier.items())
    for (const auto& [name, saved] : saved_variants.items()) {
      const auto now = std::find_if(variants.begin(), variants.end(), [&](const Variant& v) { return v.name == name; });
      if (now == variants.end() || saved.at("settings") != nlohmann::json(now->settings)) continue;
      const std::string key = fmt::format("{} at {}", name, size);
      if (saved.contains("error")) {
        errors_[key] = saved.at("error").get<std::string>();
        reused_.push_back(fmt::format("{} at {}x{} (failed)", name, size, size));
      } else {
        for (const nlohmann::json& round : saved.at("rounds")) results_[key].emplace_back(step_result_from_json(round));
        reused_.push_back(fmt::format("{} at {}x{} ({} round(s))", name, size, size, results_[key].size()));
      }
      json_[size][name] = saved;
    }
}

ClaimRow run_step_claim(StepMeasurements& measurements, const ClaimCatalogue& catalogue, const Claim& claim,
                        const StepValues& values, int64_t image_size, int64_t rounds) {
  const ClaimRow row = claim_row(claim, fill_placeholders(claim.text, step_placeholders(values)), image_size);
  const Variant a = fill_variant(catalogue.variants.at(claim.a), values);
  const Variant b = fill_variant(catalogue.variants.at(claim.b), values);
  SideRounds a_rounds{a.name, {}, {}};
  SideRounds b_rounds{b.name, {}, {}};
  for (int64_t round = 0; round < rounds; ++round) {
    const auto& a_result = measurements.step(a, image_size, round);
    if (!a_result) return not_measurable(row, measurements.error(a, image_size));
    const auto& b_result = measurements.step(b, image_size, round);
    if (!b_result) return not_measurable(row, measurements.error(b, image_size));
    for (const auto& [side, result] : {std::pair{&a_rounds, &*a_result}, std::pair{&b_rounds, &*b_result}}) {
      side->images_per_second.push_back(result->images_per_second);
      side->peak_bytes.push_back(static_cast<double>(result->peak_memory_bytes));
    }
  }
  return judge_step_claim(claim, row, a_rounds, b_rounds);
}

// ---- The other claims -------------------------------------------------------------------------

std::vector<ClaimRow> run_matmul_claim(const Claim& claim, const ReproduceOptions& options, const c10::Device& device,
                                       nlohmann::json& results) {
  std::vector<ClaimRow> rows;
  for (const MatmulResult& r : bench_matmul(device, claim.precisions, options.matmul_size, 10, options.matmul_products)) {
    results.push_back(to_json(r));
    ClaimRow row = claim_row(claim, fill_placeholders(claim.text, {{"n", std::to_string(r.n)},
                                                                    {"products", std::to_string(r.products)},
                                                                    {"precision", r.precision}}));
    if (!r.error.empty()) {
      rows.push_back(not_measurable(row, r.error));
      continue;
    }
    row.measured = fmt::format("{:.4g} TFLOP/s ({:.3f} ms per product)", r.tflops, r.ms_per_product);
    row.verdict = "measured";
    rows.push_back(row);
  }
  return rows;
}

ClaimRow card_claim_row(const Claim& claim, const std::optional<env::Gpu>& gpu, const std::string& device) {
  const PublishedCard& card = *published_card(claim.card);
  const PublishedCard* here = gpu ? published_card(gpu->name) : nullptr;
  ClaimRow row = claim_row(claim, claim.text);
  row.verdict = "wrong: " + fill_placeholders(claim.wrong, {{"published", describe(card)}});
  if (here == &card) {
    row.measured = fmt::format("this device is one: {} ({} SMs, {:.1f} GiB, compute capability {}.{})", gpu->name,
                               gpu->multiprocessors, static_cast<double>(gpu->memory_bytes) / kGiB, gpu->major,
                               gpu->minor);
    return row;
  }
  // What the driver says of this device, and what NVIDIA publishes for it where it is known.
  row.measured = "this device: " + device;
  if (here) row.measured += "; published: " + describe(*here);
  if (gpu) row.measured += fmt::format("; the driver reports {} SMs", gpu->multiprocessors);
  return row;
}

ClaimRow unmeasurable_claim_row(const Claim& claim) { return not_measurable(claim_row(claim, claim.text), claim.why); }

}  // namespace ltrain::bench
