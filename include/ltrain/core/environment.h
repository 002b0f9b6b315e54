#pragma once
// What this machine and this build of ltrain offer, for `ltrain doctor` (the GPU guides'
// environment checks in one place): versions of LibTorch, CUDA, cuDNN and NCCL, each GPU, and how
// ltrain was built.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ltrain::env {

struct Gpu {
  int index = 0;
  std::string name;
  int major = 0;  ///< compute capability
  int minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;
  /// TF32 tensor cores and bfloat16 arithmetic came with Ampere (compute capability 8.0).
  bool tf32() const { return major >= 8; }
  bool bf16() const { return major >= 8; }
};

struct Environment {
  std::string ltrain_version;
  std::string source_commit;  ///< git describe of the sources built (build_info.h), or "unknown"
  std::string torch_version;
  std::string compiler;    ///< e.g. "GCC 12.2.0"
  std::string build_type;  ///< CMake's, e.g. "Release"
  bool cuda_build = false;
  std::vector<std::string> c10d_backends;  ///< the data-parallel backends built in: "gloo", "nccl"
  int cuda_runtime = 0;  ///< CUDA's encoding (13000 = 13.0); 0 when absent
  int cuda_driver = 0;   ///< the newest CUDA the driver supports, same encoding; 0 when absent
  std::string nvidia_driver;  ///< the NVIDIA kernel module's version ("580.95.05"); "" when none is loaded
  int cudnn = 0;         ///< cuDNN's encoding (91900 = 9.19.0); 0 when absent
  int nccl = 0;          ///< NCCL's encoding (22703 = 2.27.3); 0 when not loaded
  int cpu_threads = 0;
  bool nvidia_device_node = false;  ///< /dev/nvidia0 exists (a GPU a CPU build cannot use)
  std::vector<Gpu> gpus;
};

/// Reads everything above from this process and machine.
Environment probe();

/// The version in the text of /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
/// Module  580.95.05  Tue ..." -> "580.95.05"); "" when it names none.
std::string nvidia_driver_version(const std::string& proc_text);

/// Mismatches and missing pieces, one sentence each, saying what to do.
std::vector<std::string> warnings(const Environment& environment);

/// "13.0", "9.19.0", "2.27.3"; "none" for 0.
std::string cuda_version_text(int code);
std::string cudnn_version_text(int code);
std::string nccl_version_text(int code);

nlohmann::json to_json(const Environment& environment);

}  // namespace ltrain::env
