#pragma once
// The run directory and what goes into it besides checkpoints: the resolved config, and the
// metrics as CSV (for spreadsheets and plots), JSON lines (for programs) and a TensorBoard event
// file.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/core/files.h"
#include "ltrain/io/tensorboard.h"

namespace ltrain::io {

/// Creates OUT_DIR/NAME, or OUT_DIR/NAME-2, -3, ... when that exists: a new run never writes into
/// an earlier run's folder. RunError when the folder cannot be created.
std::filesystem::path create_run_dir(const std::filesystem::path& out_dir, const std::string& name);

/// Writes `text` to `file` atomically (files::write_atomically). WriteError naming the file when the
/// system refuses.
void write_text_file(const std::filesystem::path& file, const std::string& text);

/// One row of metrics: "step" rows at log intervals, "epoch" rows after each epoch. (metrics.jsonl
/// also has a "run" row where each process starts: MetricsLog::write_run.)
struct MetricsRow {
  std::string kind;  ///< "step" or "epoch"
  int64_t epoch = 0;  ///< 1-based epoch the row belongs to
  int64_t step = 0;   ///< optimizer steps done so far
  std::map<std::string, double> values;  ///< keys from MetricsLog::columns()
};

/// Drops the rows a resumed run will write again from RUN_DIR/metrics.csv, metrics.jsonl and its
/// TensorBoard event files: those after `step`, the "run" row at `step` (the resumed process
/// writes its own), and the epoch row at `step` unless `epoch_row_at_step_kept` (a checkpoint
/// taken after its epoch's evaluation). A torn last row or record goes too. Missing files are left
/// missing.
void truncate_metrics(const std::filesystem::path& run_dir, int64_t step, bool epoch_row_at_step_kept);

/// A metrics column as a TensorBoard scalar: rows of `kind`, their value of `column`, under `tag`.
struct TensorBoardTag {
  std::string kind;
  std::string column;
  std::string tag;
};
/// Every column of step and epoch rows that TensorBoard shows ("train/loss", "test/accuracy", ...).
/// An epoch row's tags are its own ("epoch/...", "test/..."): its LR and loss scale are those of
/// the step row at the same step, which TensorBoard already has.
const std::vector<TensorBoardTag>& tensorboard_tags();
/// The text tags of a "run" row: the resolved config and the provenance record, as JSON.
constexpr const char* kConfigTextTag = "config";
constexpr const char* kProvenanceTextTag = "provenance";

/// `text` as a Markdown code block (each line indented by four spaces), which TensorBoard's text
/// plugin shows as written.
std::string markdown_code_block(const std::string& text);

/// Appends rows to RUN_DIR/metrics.csv, RUN_DIR/metrics.jsonl and, with `tensorboard`, a new
/// TensorBoard event file (io::EventFile), each in the files when write() returns. WriteError
/// naming the file at the first write the system refuses.
class MetricsLog {
 public:
  /// Opens (creates) the files; a new CSV file gets its header, and one written by another version
  /// of ltrain is rewritten under this version's header (its cells kept under their column names).
  explicit MetricsLog(const std::filesystem::path& run_dir, bool tensorboard = false);
  /// The "run" row of a process that starts training at `step` (0, or a resumed checkpoint's)
  /// in `epoch`: {"kind": "run", "epoch", "step", "provenance"} in metrics.jsonl (the CSV has no
  /// columns for it), and in TensorBoard `config` and `provenance` as texts at `step`.
  void write_run(int64_t epoch, int64_t step, const nlohmann::json& provenance, const nlohmann::json& config);
  /// Appends `row` to the files.
  void write(const MetricsRow& row);

  /// The value columns, in CSV order.
  static const std::vector<std::string>& columns();

 private:
  std::vector<std::string> old_csv_columns_;  // kept from an older version's CSV, after this version's
  files::AppendFile csv_;
  files::AppendFile jsonl_;
  std::optional<EventFile> events_;
};

}  // namespace ltrain::io
