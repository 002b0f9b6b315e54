#include "ltrain/io/run_files.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ltrain/core/errors.h"

namespace ltrain::io {
namespace fs = std::filesystem;

fs::path create_run_dir(const fs::path& out_dir, const std::string& name) {
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error)
    throw RunError(fmt::format("{}: cannot create the runs folder ({}); set run.out_dir to a writable folder",
                               out_dir.string(), error.message()));
  for (int suffix = 1;; ++suffix) {
    const fs::path candidate = out_dir / (suffix == 1 ? name : fmt::format("{}-{}", name, suffix));
    // create_directory is atomic: false means another run (or an earlier one) owns the name.
    if (fs::create_directory(candidate, error)) return candidate;
    if (error)
      throw RunError(fmt::format("{}: cannot create the run folder ({}); set run.out_dir to a writable folder",
                                 candidate.string(), error.message()));
  }
}

void write_text_file(const fs::path& file, const std::string& text) {
  files::write_atomically(file, {{text.data(), text.size()}});
}

namespace {
/// Keeps the lines of `file` for which `keep(line)` holds (the first line always when `header`).
void filter_lines(const fs::path& file, bool header, const std::function<bool(const std::string&)>& keep) {
  std::ifstream in(file);
  if (!in) return;
  std::string kept, line;
  for (bool first = true; std::getline(in, line); first = false)
    if ((first && header) || keep(line)) kept += line + '\n';
  in.close();
  write_text_file(file, kept);
}

/// The kind of row ("step", "epoch" or "run") whose TensorBoard record begins with `tag`.
std::string row_kind_of_tag(const std::string& tag) {
  if (tag == kConfigTextTag || tag == kProvenanceTextTag) return "run";
  for (const TensorBoardTag& entry : tensorboard_tags())
    if (entry.tag == tag) return entry.kind;
  return "step";
}
}  // namespace

void truncate_metrics(const fs::path& run_dir, int64_t step, bool epoch_row_at_step_kept) {
  auto keep = [&](const std::string& kind, int64_t row_step) {
    if (kind == "run") return row_step < step;
    return row_step < step || (row_step == step && (kind != "epoch" || epoch_row_at_step_kept));
  };
  filter_lines(run_dir / "metrics.csv", /*header=*/true, [&](const std::string& line) {
    // kind,epoch,step,...
    const size_t first = line.find(','), second = line.find(',', first + 1);
    if (first == std::string::npos || second == std::string::npos) return false;
    const char* digits = line.c_str() + second + 1;
    char* end = nullptr;
    const long long row_step = std::strtoll(digits, &end, 10);
    return end != digits && keep(line.substr(0, first), row_step);  // a torn last line goes
  });
  filter_lines(run_dir / "metrics.jsonl", /*header=*/false, [&](const std::string& line) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) return false;  // a torn last line goes
    const nlohmann::json kind = row.value("kind", nlohmann::json("")), row_step = row.value("step", nlohmann::json(0));
    // A row ltrain did not write (a kind or step of another type) goes as a torn line does.
    return kind.is_string() && row_step.is_number_integer() && keep(kind.get<std::string>(), row_step.get<int64_t>());
  });
  filter_event_files(run_dir,
                     [&](const EventRecord& record) { return keep(row_kind_of_tag(record.first_tag), record.step); });
}

const std::vector<std::string>& MetricsLog::columns() {
  static const std::vector<std::string> names{
      "lr",        "train_loss", "train_acc",     "test_loss",      "test_acc",           "img_per_s",
      "elapsed_s", "loss_scale", "skipped_steps", "gpu_memory_gib", "gpu_peak_memory_gib"};
  return names;
}

const std::vector<TensorBoardTag>& tensorboard_tags() {
  static const std::vector<TensorBoardTag> tags{
      {"step", "train_loss", "train/loss"},
      {"step", "train_acc", "train/accuracy"},
      {"step", "lr", "train/lr"},
      {"step", "img_per_s", "train/images_per_second"},
      {"step", "loss_scale", "train/loss_scale"},
      {"step", "skipped_steps", "train/skipped_steps"},
      {"step", "gpu_memory_gib", "gpu/memory_gib"},
      {"step", "gpu_peak_memory_gib", "gpu/peak_memory_gib"},
      {"epoch", "train_loss", "epoch/train_loss"},
      {"epoch", "train_acc", "epoch/train_accuracy"},
      {"epoch", "img_per_s", "epoch/images_per_second"},
      {"epoch", "test_loss", "test/loss"},
      {"epoch", "test_acc", "test/accuracy"},
  };
  return tags;
}

std::string markdown_code_block(const std::string& text) {
  std::string out = "    ";
  for (const char c : text) out += c == '\n' ? std::string("\n    ") : std::string(1, c);
  return out;
}

namespace {
std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells;
  size_t begin = 0;
  for (size_t comma; (comma = line.find(',', begin)) != std::string::npos; begin = comma + 1)
    cells.push_back(line.substr(begin, comma - begin));
  cells.push_back(line.substr(begin));
  return cells;
}

/// Makes `file` a CSV with this version's header, keeping what is already in it: a new file gets
/// the header; a file of a run started by another version of ltrain (a resumed run) is rewritten
/// under this version's columns, each old cell moved under its column's name and the old columns
/// this version does not write kept at the end. Returns those old columns (new rows leave them empty).
std::vector<std::string> prepare_csv(const fs::path& file) {
  std::vector<std::string> header{"kind", "epoch", "step"};
  header.insert(header.end(), MetricsLog::columns().begin(), MetricsLog::columns().end());
  if (!fs::exists(file)) {
    write_text_file(file, fmt::format("{}\n", fmt::join(header, ",")));
    return {};
  }
  if (!fs::is_regular_file(file)) return {};  // a device or pipe is written to as it is, never read
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> old_header = split_csv_line(line);
  if (old_header == header) return {};

  std::vector<std::string> kept_old_columns;
  for (const std::string& name : old_header)
    if (std::find(header.begin(), header.end(), name) == header.end()) kept_old_columns.push_back(name);
  header.insert(header.end(), kept_old_columns.begin(), kept_old_columns.end());
  std::string rewritten = fmt::format("{}\n", fmt::join(header, ","));
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> cells = split_csv_line(line);
    std::vector<std::string> moved(header.size());
    for (size_t i = 0; i < cells.size() && i < old_header.size(); ++i)
      moved[static_cast<size_t>(std::find(header.begin(), header.end(), old_header[i]) - header.begin())] = cells[i];
    rewritten += fmt::format("{}\n", fmt::join(moved, ","));
  }
  in.close();
  write_text_file(file, rewritten);
  return kept_old_columns;
}
}  // namespace

MetricsLog::MetricsLog(const fs::path& run_dir, bool tensorboard)
    : old_csv_columns_(prepare_csv(run_dir / "metrics.csv")),
      csv_(run_dir / "metrics.csv"),
      jsonl_(run_dir / "metrics.jsonl") {
  if (tensorboard) events_.emplace(new_event_file_name(run_dir));
}

void MetricsLog::write_run(int64_t epoch, int64_t step, const nlohmann::json& provenance,
                           const nlohmann::json& config) {
  jsonl_.append(nlohmann::json{{"kind", "run"}, {"epoch", epoch}, {"step", step}, {"provenance", provenance}}.dump() +
                '\n');
  if (events_)
    events_->write_texts(step, {{kConfigTextTag, markdown_code_block(config.dump(2))},
                                {kProvenanceTextTag, markdown_code_block(provenance.dump(2))}});
}

void MetricsLog::write(const MetricsRow& row) {
  for (const auto& [key, value] : row.values)
    if (std::find(columns().begin(), columns().end(), key) == columns().end())
      throw std::logic_error("MetricsLog: unknown metrics column " + key);
  nlohmann::json record{{"kind", row.kind}, {"epoch", row.epoch}, {"step", row.step}};
  std::string line = fmt::format("{},{},{}", row.kind, row.epoch, row.step);
  for (const auto& column : columns()) {
    line += ',';
    auto it = row.values.find(column);
    if (it == row.values.end()) continue;
    line += fmt::format("{:.6g}", it->second);
    record[column] = std::isfinite(it->second) ? nlohmann::json(it->second) : nlohmann::json(nullptr);
  }
  line.append(old_csv_columns_.size(), ',');
  csv_.append(line + '\n');
  jsonl_.append(record.dump() + '\n');
  if (!events_) return;
  Scalars scalars;
  for (const TensorBoardTag& entry : tensorboard_tags()) {
    const auto it = row.values.find(entry.column);
    if (entry.kind == row.kind && it != row.values.end()) scalars.emplace_back(entry.tag, it->second);
  }
  events_->write_scalars(row.step, scalars);
}

}  // namespace ltrain::io
