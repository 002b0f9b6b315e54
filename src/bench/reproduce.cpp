#include "ltrain/bench/reproduce.h"

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/claim_runner.h"
#include "ltrain/config/load.h"
#include "ltrain/core/environment.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/io/provenance.h"

namespace ltrain::bench {
namespace fs = std::filesystem;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// The architecture NVIDIA names for a compute capability.
std::string architecture(int major, int minor) {
  if (major == 7) return minor == 0 ? "Volta" : "Turing";
  if (major == 8) return minor == 9 ? "Ada Lovelace" : "Ampere";
  if (major == 9) return "Hopper";
  if (major >= 10) return "Blackwell";
  return "pre-Volta";
}

/// The precision of the claims that compare no precisions: the guides' fp16 where the device has it
/// (CUDA), else the base config's.
std::string unpaired_precision(const config::LoadedConfig& base, const torch::Device& device) {
  return device.is_cuda() ? "fp16" : config::to_string(base.config.precision.mode);
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
  const std::string claims =
      options.claims_file.empty() ? "" : fmt::format(" Claims: `{}`.", options.claims_file.string());
  return fmt::format(
      "Base config: `{}`{}. Model: {} ({} stem, {} classes, channels_last {}). Images: {} ({}), measured at {}. "
      "Batch {}, {} with lr {}. Each claim sets the precisions it compares; the others run under {}. {} untimed and {} "
      "timed steps per measurement, {} round(s) of A then B per claim.{}",
      options.base_config.string(),
      set_flags(options.overrides),
      config::to_string(c.model.arch), config::to_string(c.model.stem), c.model.num_classes,
      c.model.channels_last ? "on" : "off", config::to_string(c.data.source),
      c.data.source == config::DataSource::synthetic ? "random pixels" : "the training set", size_list,
      c.data.batch_size, config::to_string(c.optim.name), c.optim.lr,
      unpaired_precision(base, device),
      options.warmup, options.steps, options.rounds, claims);
}

}  // namespace

ReproduceReport reproduce(const ReproduceOptions& options, const fs::path& out_dir) {
  const auto started = std::chrono::system_clock::now();
  const config::LoadedConfig base = config::load_file(options.base_config, options.overrides);
  const ClaimCatalogue catalogue =
      options.claims_file.empty() ? shipped_claims() : load_claims(options.claims_file);
  const torch::Device device = engine::resolve_device(base);
  // What the A/B claims' placeholders stand for here, and their variants filled.
  const StepValues values{unpaired_precision(base, device),
                          base.config.data.batch_size * base.config.optim.accumulation_steps};
  std::vector<Variant> variants;
  std::map<std::string, std::string> named_by;  // a variant's name here -> its name in the file
  for (const auto& [name, variant] : catalogue.variants) {
    variants.push_back(fill_variant(variant, values));
    // The measurements go by a variant's name: two variants may not come to one name here.
    const auto [other, first] = named_by.emplace(variants.back().name, name);
    if (!first)
      throw ConfigError(fmt::format("{}: variants \"{}\" and \"{}\" are both \"{}\" on this config and device; "
                                    "give them names of their own",
                                    catalogue.source, other->second, name, variants.back().name));
  }
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
  report.guides = catalogue.guides;
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

  StepMeasurements m(options, base, device, options.fresh ? nlohmann::json() : earlier_steps(out_dir, report.settings),
                     variants);
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
  const auto is_step_claim = [](const Claim& claim) {
    return claim.kind == ClaimKind::speed || claim.kind == ClaimKind::memory;
  };
  for (const int64_t size : sizes)
    for (const Claim& claim : catalogue.claims)
      if (is_step_claim(claim))
        report.rows.push_back(run_step_claim(m, catalogue, claim, values, size, options.rounds));

  for (const Claim& claim : catalogue.claims) {
    switch (claim.kind) {
      case ClaimKind::speed:
      case ClaimKind::memory:
        break;  // measured above
      case ClaimKind::matmul: {
        nlohmann::json& results = report.measurements["matmul"];
        if (!results.is_array()) results = nlohmann::json::array();
        for (const ClaimRow& row : run_matmul_claim(claim, options, device, results)) report.rows.push_back(row);
        save_progress();
        break;
      }
      case ClaimKind::batch_search:
        report.rows.push_back(run_batch_search_claim(claim, options, base, device, out_dir));
        break;
      case ClaimKind::card:
        report.rows.push_back(card_claim_row(claim, gpu, report.device));
        break;
      case ClaimKind::unmeasurable:
        report.rows.push_back(unmeasurable_claim_row(claim));
        break;
    }
  }
  report.measurements["steps"] = m.json();
  report.finished = true;
  return report;
}

}  // namespace ltrain::bench
