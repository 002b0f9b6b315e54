#include "ltrain/core/environment.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "ltrain/core/build_info.h"
#include "ltrain/core/files.h"
#include "ltrain/core/torch_compat.h"

#if LTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime_api.h>
#endif

namespace ltrain::env {
namespace {

std::string compiler_text() {
#if defined(__clang__)
  return fmt::format("Clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return fmt::format("GCC {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "unknown compiler";
#endif
}

/// NCCL's version if a library in this process provides it (LibTorch with CUDA links it).
int loaded_nccl_version() {
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*); ncclSuccess is 0
  void* symbol = ::dlsym(RTLD_DEFAULT, "ncclGetVersion");
  if (!symbol) return 0;
  GetVersion get_version = nullptr;
  std::memcpy(&get_version, &symbol, sizeof get_version);  // object to function pointer, as POSIX allows
  int version = 0;
  return get_version(&version) == 0 ? version : 0;
}

/// major.minor.patch of a version code packed as major*big + minor*100 + patch.
std::string packed_version_text(int code, int big) {
  return fmt::format("{}.{}.{}", code / big, (code % big) / 100, code % 100);
}

}  // namespace

std::string nvidia_driver_version(const std::string& proc_text) {
  // "Kernel Module  580.95.05  ..." or "Open Kernel Module for x86_64  575.57.08  ...": the first
  // version-like word after "Kernel Module".
  static const std::regex kernel_module(R"(Kernel Module.*?\s([0-9]+\.[0-9]+(?:\.[0-9]+)?)(?=\s|$))");
  std::smatch match;
  return std::regex_search(proc_text, match, kernel_module) ? match[1].str() : "";
}

Environment probe() {
  Environment e;
  e.ltrain_version = LTRAIN_VERSION;
  e.source_commit = source_commit();
  e.torch_version = compat::torch_version();
  e.compiler = compiler_text();
  e.build_type = LTRAIN_BUILD_TYPE;
  e.cuda_build = compat::built_with_cuda();
  if (LTRAIN_WITH_GLOO) e.c10d_backends.push_back("gloo");
  if (LTRAIN_WITH_NCCL) e.c10d_backends.push_back("nccl");
  e.cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  std::error_code ignored;
  e.nvidia_device_node = std::filesystem::exists("/dev/nvidia0", ignored);
  e.nccl = loaded_nccl_version();
  // The kernel module's own file: no NVML to load, and present in containers that see the GPUs.
  e.nvidia_driver = nvidia_driver_version(files::read_regular_file("/proc/driver/nvidia/version", 4096).text);
#if LTRAIN_WITH_CUDA
  cudaRuntimeGetVersion(&e.cuda_runtime);
  cudaDriverGetVersion(&e.cuda_driver);
  e.cudnn = static_cast<int>(at::detail::getCUDAHooks().versionCuDNN());
  const int count = compat::cuda_device_count();
  for (int index = 0; index < count; ++index) {
    const cudaDeviceProp* properties = at::cuda::getDeviceProperties(index);
    e.gpus.push_back({index, properties->name, properties->major, properties->minor,
                      properties->multiProcessorCount, static_cast<int64_t>(properties->totalGlobalMem)});
  }
#endif
  return e;
}

std::string cuda_version_text(int code) {
  return code == 0 ? "none" : fmt::format("{}.{}", code / 1000, (code % 1000) / 10);
}

std::string cudnn_version_text(int code) {
  // cuDNN 9 packs major*10000, cuDNN 8 and older major*1000.
  return code == 0 ? "none" : packed_version_text(code, code >= 90000 ? 10000 : 1000);
}

std::string nccl_version_text(int code) {
  // NCCL 2.9 and later pack major*10000, earlier releases major*1000.
  return code == 0 ? "none" : packed_version_text(code, code >= 20900 ? 10000 : 1000);
}

std::vector<std::string> warnings(const Environment& e) {
  std::vector<std::string> out;
  if (!e.cuda_build) {
    if (e.nvidia_device_node)
      out.push_back("this ltrain was built against a CPU-only LibTorch, but the machine has an NVIDIA GPU: install "
                    "a CUDA torch (pip install torch) or unpack the LibTorch archive (LIBTORCH=DIR), then build again "
                    "with bash scripts/setup.sh");
    return out;
  }
  if (e.cuda_driver == 0)
    out.push_back("no NVIDIA driver answers: install one, or run with run.device \"cpu\"");
  else if (e.cuda_driver < e.cuda_runtime)
    out.push_back(fmt::format("the driver supports CUDA {} but LibTorch's runtime is CUDA {}: update the driver",
                              cuda_version_text(e.cuda_driver), cuda_version_text(e.cuda_runtime)));
  if (std::find(e.c10d_backends.begin(), e.c10d_backends.end(), "nccl") == e.c10d_backends.end())
    out.push_back("this CUDA build has no NCCL (nccl.h was not found when it was built): data-parallel runs on GPUs "
                  "need it; install the nvidia-nccl wheel or NCCL's headers and build again");
  if (e.cuda_driver != 0 && e.gpus.empty())
    out.push_back("no usable CUDA device (check CUDA_VISIBLE_DEVICES and nvidia-smi)");
  if (e.cudnn == 0) out.push_back("cuDNN is not available: convolutions will be slow; install LibTorch with cuDNN");
  if (e.nccl == 0 && e.gpus.size() > 1)
    out.push_back("NCCL is not loaded: multi-GPU training needs a LibTorch built with NCCL");
  for (const Gpu& gpu : e.gpus)
    if (!gpu.tf32())
      out.push_back(fmt::format("GPU {} ({}) has compute capability {}.{}: no TF32 or bf16 (Ampere and newer); use "
                                "precision.mode \"fp16\" or \"fp32\"",
                                gpu.index, gpu.name, gpu.major, gpu.minor));
  return out;
}

nlohmann::json to_json(const Environment& e) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const Gpu& gpu : e.gpus)
    gpus.push_back({{"index", gpu.index},
                    {"name", gpu.name},
                    {"compute_capability", fmt::format("{}.{}", gpu.major, gpu.minor)},
                    {"multiprocessors", gpu.multiprocessors},
                    {"memory_bytes", gpu.memory_bytes},
                    {"tf32", gpu.tf32()},
                    {"bf16", gpu.bf16()}});
  return {{"ltrain", e.ltrain_version},
          {"source_commit", e.source_commit},
          {"libtorch", e.torch_version},
          {"build",
           {{"compiler", e.compiler}, {"type", e.build_type}, {"cuda", e.cuda_build}, {"c10d_backends", e.c10d_backends}}},
          {"cuda_runtime", cuda_version_text(e.cuda_runtime)},
          {"cuda_driver", cuda_version_text(e.cuda_driver)},
          {"nvidia_driver", e.nvidia_driver.empty() ? "none" : e.nvidia_driver},
          {"cudnn", cudnn_version_text(e.cudnn)},
          {"nccl", nccl_version_text(e.nccl)},
          {"cpu_threads", e.cpu_threads},
          {"gpus", gpus},
          {"warnings", warnings(e)}};
}

}  // namespace ltrain::env
