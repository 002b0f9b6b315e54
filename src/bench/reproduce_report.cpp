#include "ltrain/bench/reproduce_report.h"

#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "ltrain/core/torch_compat.h"
#include "ltrain/io/run_files.h"

namespace ltrain::bench {
namespace fs = std::filesystem;

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
  for (const Guide& guide : report.guides) text += fmt::format("- **{}**: {} ({})\n", guide.name, guide.title, guide.about);
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
