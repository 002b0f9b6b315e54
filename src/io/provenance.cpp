#include "ltrain/io/provenance.h"

#include <unistd.h>

#include <climits>
#include <ctime>

#include <fmt/format.h>

#include "ltrain/core/environment.h"
#include "ltrain/core/sha256.h"

namespace ltrain::io {

std::string utc_iso8601(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  return fmt::format("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}Z", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                     utc.tm_hour, utc.tm_min, utc.tm_sec);
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "unknown";
  return name;
}

nlohmann::json provenance(const std::vector<std::string>& config_files, const nlohmann::json& resolved_config,
                          std::chrono::system_clock::time_point started) {
  const env::Environment e = env::probe();
  nlohmann::json gpus = nlohmann::json::array();
  for (const env::Gpu& gpu : e.gpus) gpus.push_back(gpu.name);
  nlohmann::json config_hash = nullptr;
  if (!resolved_config.is_null()) {
    const std::string canonical = resolved_config.dump();
    config_hash = sha256_hex(canonical.data(), canonical.size());
  }
  return {{"ltrain_version", e.ltrain_version},
          {"source_commit", e.source_commit},
          {"libtorch", e.torch_version},
          {"cuda", env::cuda_version_text(e.cuda_runtime)},
          {"cudnn", env::cudnn_version_text(e.cudnn)},
          {"nccl", env::nccl_version_text(e.nccl)},
          {"nvidia_driver", e.nvidia_driver.empty() ? "none" : e.nvidia_driver},
          {"gpus", gpus},
          {"config_files", config_files},
          {"config_sha256", config_hash},
          {"host", host_name()},
          {"started_at", utc_iso8601(started)}};
}

}  // namespace ltrain::io
