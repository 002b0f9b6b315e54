#pragma once
// What a run reports of itself beside its loop: the lines it starts with, the summary it ends
// with (the "done: ..." line, summary.json), and the plan `ltrain train --dry-run` prints
// (plan_run and to_text, declared in ltrain/engine/trainer.h). Private to engine.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "early_stopping.h"
#include "ltrain/config/config.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/trainer.h"
#include "resume.h"

namespace ltrain::engine {

/// The start-up lines: versions, device and seed, the run directory, GPU limits, where the run
/// resumes (`begin`, with the settings changed since the checkpoint), the settings table,
/// data-parallel processes, model, data and steps, precision and the step's kernels.
void log_start(Run& run, const StartPoint& start, const ResumePoint& begin, const RunLength& length,
               const std::filesystem::path& run_dir);

/// The results as summary.json and the "done" line's JSON fields hold them.
nlohmann::json result_json(const TrainResult& result);

/// The run's last line: "done: 3 epoch(s), 12 steps in ...", the whole run's times first, then
/// this process's where it resumed; with run.early_stop_metric test_loss, that metric's best too.
void log_summary(const TrainResult& result, const config::RunConfig& config,
                 const EarlyStopping::Standing& early_stop);

/// A run resumed at its end whose summary is written: one line, and nothing is trained.
void log_nothing_to_train(const TrainResult& result, const std::filesystem::path& checkpoint,
                          const std::string& length);

/// summary.json in `run_dir`: the results, the data and where they come from (`provenance`).
void write_summary(const std::filesystem::path& run_dir, const TrainResult& result, const config::RunConfig& config,
                   const nlohmann::json& provenance);

}  // namespace ltrain::engine
