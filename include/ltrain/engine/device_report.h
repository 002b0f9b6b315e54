#pragma once
// What ltrain's fast paths do on each GPU of this machine, for `ltrain doctor`: which code the
// driver loads for ltrain's kernels, which kernels and fused paths run there and why not, and the
// limits LTRAIN_GPU_PROFILE imposes. Joins core/environment's versions and GPUs with what models/
// and optim/ say of their kernels.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/core/environment.h"

namespace ltrain::engine {

/// One of the paths that make a step fast, on one GPU.
struct FastPath {
  std::string name;  ///< e.g. "own BatchNorm kernels"
  bool active = false;
  std::string note;  ///< why not, or what it runs on
};

struct GpuReport {
  int index = 0;
  std::string kernel_code;  ///< what the build carries for this GPU, e.g. "sm_90 machine code"
  bool kernels_load = false;  ///< the driver found (or compiled) code for ltrain's kernels there
  int64_t memory_limit_bytes = 0;  ///< within LTRAIN_GPU_PROFILE's card
  std::vector<FastPath> fast_paths;
};

struct DoctorReport {
  env::Environment environment;
  std::string cuda_architectures;  ///< what the kernels were built for ("" in a CPU build)
  std::string gpu_profile;         ///< LTRAIN_GPU_PROFILE's value; "" when unset
  std::vector<GpuReport> gpus;     ///< one per environment.gpus entry
  std::vector<std::string> warnings;  ///< environment's, then the fast paths', one sentence each
};

/// Probes this process and machine (env::probe) and asks each GPU what runs there.
DoctorReport doctor_report();

/// The warnings about the fast paths of `gpus` (code missing for a GPU, a build without cuDNN's
/// fused BatchNorm, an unknown LTRAIN_GPU_PROFILE), one sentence each, saying what to do.
std::vector<std::string> fast_path_warnings(const DoctorReport& report);

/// The report as the doctor prints it, and as JSON (env::to_json's fields, each GPU with its
/// kernel code, memory limit and fast paths, and the build's CUDA architectures).
std::string to_text(const DoctorReport& report);
nlohmann::json to_json(const DoctorReport& report);

}  // namespace ltrain::engine
