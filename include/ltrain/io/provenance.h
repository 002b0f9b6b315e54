#pragma once
// Where a result came from: the record that summary.json, metrics.jsonl's "run" row, a sweep's
// results.json and the reproduce report carry, built by the one function below.
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ltrain::io {

/// {"ltrain_version", "source_commit" (git describe of the build's sources, or "unknown"),
///  "libtorch", "cuda", "cudnn", "nccl", "nvidia_driver" ("none" where absent), "gpus" (the names
///  of the GPUs this process sees, by index), "config_files" (the file and every file it extends),
///  "config_sha256" (SHA-256 of `resolved_config.dump()`, the canonical text of config.json; null
///  without a config), "host", "started_at" (UTC, ISO 8601)}.
nlohmann::json provenance(const std::vector<std::string>& config_files, const nlohmann::json& resolved_config,
                          std::chrono::system_clock::time_point started);

/// "2026-12-01T09:30:00Z".
std::string utc_iso8601(std::chrono::system_clock::time_point time);

/// This machine's host name ("unknown" if the system gives none).
std::string host_name();

}  // namespace ltrain::io
