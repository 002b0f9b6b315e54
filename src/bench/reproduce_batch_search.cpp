// The batch-size search of `ltrain reproduce`: a sweep of batch sizes up to a fraction of the
// GPU's memory (sweep.h's batch search), as the 4090D guide describes it.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/bench/claim_runner.h"
#include "ltrain/bench/sweep.h"
#include "ltrain/io/run_files.h"

namespace ltrain::bench {
namespace fs = std::filesystem;

ClaimRow run_batch_search_claim(const Claim& claim, const ReproduceOptions& options, const config::LoadedConfig& base,
                                const c10::Device& device, const fs::path& out_dir) {
  ClaimRow search = claim_row(claim, claim.text);
  if (!device.is_cuda() || !options.batch_search)
    return not_measurable(search, device.is_cuda() ? "skipped (--no-batch-search)" : "the search measures GPU memory");
  // Steps at the large batches take up to a second: fewer of them time it well.
  constexpr int64_t kLargestBatch = 262144;
  const double fraction = claim.memory_fraction;
  const std::string fraction_text = fmt::format("{:.0f}%", 100.0 * fraction);
  const int64_t warmup = std::max(std::min<int64_t>(options.warmup, 6), base.config.cuda_graph.warmup_steps + 1);
  nlohmann::json sweep{
      {"base", fs::absolute(options.base_config).string()},
      {"set", options.overrides},
      {"mode", "bench"},
      {"bench", {{"warmup", warmup}, {"steps", std::min<int64_t>(options.steps, 12)}, {"rounds", 1}}},
      {"batch_search",
       {{"start", claim.start_batch}, {"factor", 2}, {"memory_fraction", fraction}, {"max", kLargestBatch}}}};
  sweep["set"].push_back("precision.mode=fp16");
  sweep["set"].push_back("cuda_graph.train=true");
  if (base.config.data.source == config::DataSource::synthetic)
    sweep["set"].push_back(fmt::format("data.synthetic_train_size={}", kLargestBatch));
  const fs::path sweep_dir = out_dir / "batch-search";
  fs::create_directories(sweep_dir);
  io::write_text_file(sweep_dir / "sweep.json", sweep.dump(2) + "\n");
  // Writes its results files as it goes; a rerun reuses the batches measured.
  const SweepResult result = run_sweep(sweep_dir / "sweep.json", sweep_dir, {}, options.fresh);
  // The largest batch under the fraction, and the smallest past it (or out of memory), over every point.
  const SweepPoint* best = nullptr;
  const SweepPoint* past = nullptr;
  const auto batch_of = [](const SweepPoint& point) { return point.settings.back().second.get<int64_t>(); };
  for (const SweepPoint& point : result.points) {
    const bool under =
        point.error.empty() && point.values.count("memory_fraction") && point.values.at("memory_fraction") <= fraction;
    const SweepPoint*& slot = under ? best : past;
    if (!slot || (under ? batch_of(point) > batch_of(*slot) : batch_of(point) < batch_of(*slot))) slot = &point;
  }
  if (!best) return not_measurable(search, result.points.empty() ? "no point ran" : result.points.front().error);
  const std::string past_text =
      !past ? fmt::format("none past {} up to the search's maximum", fraction_text)
            : fmt::format("the smallest past {}: batch {} ({})", fraction_text, batch_of(*past),
                          past->error.empty()
                              ? fmt::format("{:.0f}% reserved", 100.0 * past->values.at("memory_fraction"))
                              : past->error);
  search.measured = fmt::format(
      "batch {} (fp16, CUDA graph) is the largest under {}: {:.0f} img/s, {:.0f}% of the GPU reserved; {} point(s), {}",
      batch_of(*best), fraction_text, best->values.at("img_per_s"), 100.0 * best->values.at("memory_fraction"),
      result.points.size(), past_text);
  search.verdict = "measured";
  return search;
}

}  // namespace ltrain::bench
