#include "ltrain/engine/device_report.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/device/architectures.h"
#include "ltrain/device/gpu_profile.h"
#include "ltrain/ops/batch_norm.h"
#include "ltrain/ops/cross_entropy.h"
#include "ltrain/ops/fused_conv.h"
#include "ltrain/ops/gradient_kernels.h"
#include "ltrain/ops/kernel_image.h"
#include "ltrain/ops/max_pool.h"

namespace ltrain::engine {
namespace {

constexpr double kGiB = 1 << 30;

FastPath path_of(std::string name, const device::KernelFit& fit) { return {std::move(name), fit.runs, fit.reason}; }

GpuReport report_gpu(const env::Gpu& gpu, const env::Environment& environment) {
  const torch::Device cuda(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu.index));
  const device::ComputeCapability capability{gpu.major, gpu.minor};
  const std::vector<device::CompiledArchitecture> built = device::parse_architectures(device::built_architectures());
  GpuReport report;
  report.index = gpu.index;
  report.kernel_code = built.empty() ? device::built_architectures()
                                     : device::describe_image(device::image_for(capability, built));
  report.kernels_load = ops::ltrain_kernel_image_fit(cuda).runs;
  report.memory_limit_bytes = device::memory_within_profile(gpu.memory_bytes);

  report.fast_paths.push_back(path_of("ltrain's BatchNorm kernels", ops::ltrain_batch_norm_fit(cuda)));
  report.fast_paths.push_back(path_of("thread-block clusters in them", ops::ltrain_batch_norm_cluster_fit(cuda)));
  report.fast_paths.push_back(
      ops::cudnn_batch_norm_built()
          ? FastPath{"cuDNN's fused BatchNorm", environment.cudnn != 0,
                     environment.cudnn != 0 ? "" : "cuDNN is not loaded"}
          : FastPath{"cuDNN's fused BatchNorm", false, "not in this build: cudnn.h was not found when it was built"});
  report.fast_paths.push_back(path_of("ltrain's max pooling kernels", ops::ltrain_max_pool_fit(cuda)));
  report.fast_paths.push_back(
      path_of("ltrain's convolutions with BatchNorm statistics (model.fused_conv)", ops::fused_conv_fit(cuda)));
  report.fast_paths.push_back(
      path_of("ltrain's SGD and inf/NaN check kernels", ops::ltrain_gradient_kernels_fit(cuda)));
  report.fast_paths.push_back(path_of("ltrain's cross-entropy kernels", ops::ltrain_cross_entropy_fit(cuda)));
  const bool nccl_built = std::find(environment.c10d_backends.begin(), environment.c10d_backends.end(), "nccl") !=
                          environment.c10d_backends.end();
  report.fast_paths.push_back({"NCCL for several GPUs", nccl_built && environment.nccl != 0,
                               !nccl_built ? "not in this build: nccl.h was not found when it was built"
                               : environment.nccl == 0 ? "NCCL is not loaded"
                                                       : ""});
  return report;
}

std::string yes_or_why(const FastPath& path) {
  if (path.active) return path.note.empty() ? "yes" : fmt::format("yes ({})", path.note);
  return fmt::format("no: {}", path.note);
}

}  // namespace

DoctorReport doctor_report() {
  DoctorReport report;
  report.environment = env::probe();
  report.cuda_architectures = device::built_architectures();
  report.gpu_profile = device::gpu_profile_setting();
  for (const env::Gpu& gpu : report.environment.gpus) report.gpus.push_back(report_gpu(gpu, report.environment));
  report.warnings = env::warnings(report.environment);
  for (std::string& warning : fast_path_warnings(report)) report.warnings.push_back(std::move(warning));
  return report;
}

std::vector<std::string> fast_path_warnings(const DoctorReport& report) {
  std::vector<std::string> out;
  if (std::string problem = device::gpu_profile_problem(report.gpu_profile); !problem.empty())
    out.push_back(std::move(problem));
  if (!report.environment.cuda_build) return out;
  const std::string carried =
      device::describe_architectures(device::parse_architectures(report.cuda_architectures));
  for (size_t i = 0; i < report.gpus.size() && i < report.environment.gpus.size(); ++i) {
    const env::Gpu& gpu = report.environment.gpus[i];
    if (!report.gpus[i].kernels_load)
      out.push_back(fmt::format("GPU {} ({}, compute capability {}.{}): this build carries no code for it ({}), so "
                                "ltrain's own kernels give way to LibTorch's and cuDNN's: build on this machine with "
                                "bash scripts/setup.sh, or add {}{} to CMAKE_CUDA_ARCHITECTURES",
                                gpu.index, gpu.name, gpu.major, gpu.minor, carried, gpu.major, gpu.minor));
  }
  if (!ops::cudnn_batch_norm_built())
    out.push_back("this build has no cuDNN fused BatchNorm (cudnn.h was not found when it was built): install the "
                  "nvidia-cudnn wheel beside torch, or cuDNN's headers, and build again");
  return out;
}

std::string to_text(const DoctorReport& report) {
  const env::Environment& e = report.environment;
  std::string text = fmt::format(
      "ltrain {} (commit {}, {} build, {}, {}), LibTorch {}, data-parallel backends: {}\n", e.ltrain_version,
      e.source_commit, e.cuda_build ? "CUDA" : "CPU-only", e.compiler, e.build_type, e.torch_version,
      e.c10d_backends.empty() ? std::string("none") : fmt::format("{}", fmt::join(e.c10d_backends, ", ")));
  if (e.cuda_build)
    text += fmt::format("CUDA kernels built for {}\n",
                        device::describe_architectures(device::parse_architectures(report.cuda_architectures)));
  text += fmt::format("CUDA runtime {} | NVIDIA driver {} (supports CUDA {}) | cuDNN {} | NCCL {} | {} CPU threads\n",
                      env::cuda_version_text(e.cuda_runtime), e.nvidia_driver.empty() ? "none" : e.nvidia_driver,
                      env::cuda_version_text(e.cuda_driver), env::cudnn_version_text(e.cudnn),
                      env::nccl_version_text(e.nccl), e.cpu_threads);
  if (const device::GpuProfile* profile = device::find_gpu_profile(report.gpu_profile))
    text += device::describe_gpu_profile(*profile) + "\n";
  for (size_t i = 0; i < e.gpus.size(); ++i) {
    const env::Gpu& gpu = e.gpus[i];
    text += fmt::format("GPU {}: {} | compute capability {}.{} | {} SMs | {:.1f} GiB | TF32 {} | bf16 {}\n", gpu.index,
                        gpu.name, gpu.major, gpu.minor, gpu.multiprocessors, gpu.memory_bytes / kGiB,
                        gpu.tf32() ? "yes" : "no", gpu.bf16() ? "yes" : "no");
    if (i >= report.gpus.size()) continue;
    const GpuReport& gpu_report = report.gpus[i];
    if (gpu_report.memory_limit_bytes < gpu.memory_bytes)
      text += fmt::format("  memory ltrain may use: {:.1f} GiB\n", gpu_report.memory_limit_bytes / kGiB);
    text += fmt::format("  kernel code: {} (loads: {})\n", gpu_report.kernel_code,
                        gpu_report.kernels_load ? "yes" : "no");
    for (const FastPath& path : gpu_report.fast_paths) text += fmt::format("  {}: {}\n", path.name, yes_or_why(path));
  }
  if (e.gpus.empty()) text += "no usable GPU\n";
  for (const std::string& warning : report.warnings) text += "warning: " + warning + "\n";
  return text;
}

nlohmann::json to_json(const DoctorReport& report) {
  nlohmann::json json = env::to_json(report.environment);
  json["build"]["cuda_architectures"] = report.cuda_architectures;
  json["gpu_profile"] = report.gpu_profile;
  for (size_t i = 0; i < report.gpus.size() && i < json["gpus"].size(); ++i) {
    const GpuReport& gpu = report.gpus[i];
    nlohmann::json paths = nlohmann::json::array();
    for (const FastPath& path : gpu.fast_paths)
      paths.push_back({{"name", path.name}, {"active", path.active}, {"note", path.note}});
    json["gpus"][i]["kernel_code"] = gpu.kernel_code;
    json["gpus"][i]["kernels_load"] = gpu.kernels_load;
    json["gpus"][i]["memory_limit_bytes"] = gpu.memory_limit_bytes;
    json["gpus"][i]["fast_paths"] = paths;
  }
  json["warnings"] = report.warnings;
  return json;
}

}  // namespace ltrain::engine
