#pragma once
// The run directory and what goes into it besides checkpoints: the resolved config, and the
// metrics as CSV (for spreadsheets and plots) and JSON lines (for programs).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ltrain/core/files.h"

namespace ltrain::io {

/// Creates OUT_DIR/NAME, or OUT_DIR/NAME-2, -3, ... when that exists: a new run never writes into
/// an earlier run's folder. RunError when the folder cannot be created.
std::filesystem::path create_run_dir(const std::filesystem::path& out_dir, const std::string& name);

/// Writes `text` to `file` atomically (files::write_atomically). WriteError naming the file when the
/// system refuses.
void write_text_file(const std::filesystem::path& file, const std::string& text);

/// One row of metrics: "step" rows at log intervals, "epoch" rows after each epoch.
struct MetricsRow {
  std::string kind;  ///< "step" or "epoch"
  int64_t epoch = 0;  ///< 1-based epoch the row belongs to
  int64_t step = 0;   ///< optimizer steps done so far
  std::map<std::string, double> values;  ///< keys from MetricsLog::columns()
};

/// Drops the rows a resumed run will write again from RUN_DIR/metrics.csv and metrics.jsonl: those
/// after `step`, and the epoch row at `step` unless `epoch_row_at_step_kept` (a checkpoint taken
/// after its epoch's evaluation). Missing files are left missing.
void truncate_metrics(const std::filesystem::path& run_dir, int64_t step, bool epoch_row_at_step_kept);

/// Appends rows to RUN_DIR/metrics.csv and RUN_DIR/metrics.jsonl, each in the files when write()
/// returns. WriteError naming the file at the first write the system refuses.
class MetricsLog {
 public:
  /// Opens (creates) both files; a new CSV file gets its header.
  explicit MetricsLog(const std::filesystem::path& run_dir);
  /// Appends `row` to both files.
  void write(const MetricsRow& row);

  /// The value columns, in CSV order.
  static const std::vector<std::string>& columns();

 private:
  files::AppendFile csv_;
  files::AppendFile jsonl_;
};

}  // namespace ltrain::io
