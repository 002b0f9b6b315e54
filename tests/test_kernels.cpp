// Whether ltrain's own CUDA kernels run on a GPU, decided as pure functions of numbers (device
// properties in, path out), and what `ltrain doctor` and `ltrain train` make of them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "ltrain/amp/autocast.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/device_report.h"
#include "ltrain/device/gpu_profile.h"
#include "ltrain/engine/setup.h"
#include "ltrain/kernels/device_fit.h"
#include "support.h"

namespace ltrain {
namespace {

using device::DeviceLimits;
using kernels::KernelFacts;
using testing::read_file;
using testing::run_ltrain;
using testing::TempDir;

constexpr int64_t kGiB = int64_t{1} << 30;

/// A kernel of 256 threads, `registers` each, compiled for `ptx` (as the BatchNorm kernels).
KernelFacts kernel(int registers, int64_t shared_bytes, int ptx = 90) {
  KernelFacts facts;
  facts.loaded = true;
  facts.ptx_version = ptx;
  facts.registers_per_thread = registers;
  facts.static_shared_memory = shared_bytes;
  facts.max_threads_per_block = 1024;
  return facts;
}

TEST(DeviceFit, CountsResidentBlocksWithinEveryLimit) {
  const DeviceLimits gpu = testing::h200_limits();
  // 128 registers: 256 threads take 32768 of 65536.
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(128, 4096), 256, gpu), 2);
  // 64 registers: the register file allows 4 blocks (65536 / 16384), the threads 8.
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(64, 4096), 256, gpu), 4);
  // Registers round up per warp to units of 256: 65 registers take 72 * 32 a warp.
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(65, 0), 256, gpu), 3);
  // Shared memory: 100 KiB a block (+1 KiB kept per block) fits twice in 228 KiB, once in 100 KiB.
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(32, 100 * 1024), 256, gpu), 2);
  const DeviceLimits rtx4090 = device::within_profile(gpu, *device::find_gpu_profile("rtx4090"));
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(32, 100 * 1024), 256, rtx4090), 0);
  // Threads: 1536 a multiprocessor on the 4090, 6 blocks of 256 where the H200 holds 8.
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(32, 0), 256, gpu), 8);
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(32, 0), 256, rtx4090), 6);
  // A kernel not loaded, or asked for more threads than it allows, fits nowhere.
  KernelFacts missing = kernel(32, 0);
  missing.loaded = false;
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(missing, 256, gpu), 0);
  EXPECT_EQ(kernels::resident_blocks_per_multiprocessor(kernel(32, 0), 2048, gpu), 0);
}

TEST(DeviceFit, ClustersNeedAGpuWithThemAndCodeForSm90) {
  const DeviceLimits gpu = testing::h200_limits();
  EXPECT_TRUE(kernels::takes_clusters(kernel(64, 0, 90), gpu));
  EXPECT_TRUE(kernels::takes_clusters(kernel(64, 0, 120), gpu));
  // PTX for sm_80 compiled on an H200: the cluster kernels' code traps there.
  const device::KernelFit ptx80 = kernels::cluster_fit(kernel(64, 0, 80), gpu);
  EXPECT_FALSE(ptx80.runs);
  EXPECT_EQ(ptx80.reason,
            "the code loaded was compiled for compute_80, which has no cluster instructions (build for sm_90 or later)");
  DeviceLimits ada = gpu;
  ada.capability = {8, 9};
  ada.cluster_launch = false;
  EXPECT_EQ(kernels::cluster_fit(kernel(64, 0, 89), ada).reason,
            "compute capability 8.9 has no thread-block clusters (9.0 and later have them)");
  const DeviceLimits rtx4090 = device::within_profile(gpu, *device::find_gpu_profile("rtx4090"));
  EXPECT_EQ(kernels::cluster_fit(kernel(64, 0, 90), rtx4090).reason,
            "LTRAIN_GPU_PROFILE=rtx4090 plans for a card without them");
}

TEST(DeviceFit, SaysWhyAFamilyOfKernelsDoesNotRun) {
  const auto built = device::parse_architectures("89-real");
  const DeviceLimits gpu = testing::h200_limits();
  EXPECT_TRUE(kernels::fit_of({kernel(128, 4096), kernel(96, 4096)}, 256, kernels::Cooperation::grid_or_cluster, gpu,
                              built)
                  .runs);
  KernelFacts missing;
  const device::KernelFit no_image =
      kernels::fit_of({kernel(128, 4096), missing}, 256, kernels::Cooperation::none, gpu, built);
  EXPECT_FALSE(no_image.runs);
  EXPECT_EQ(no_image.reason, "no kernel image for compute capability 9.0 in this build (it carries sm_89)");
  const device::KernelFit too_big = kernels::fit_of({kernel(32, 120 * 1024)}, 256, kernels::Cooperation::none,
                                                     device::within_profile(gpu, *device::find_gpu_profile("rtx4090")),
                                                     built);
  EXPECT_EQ(too_big.reason,
            "a block of 256 threads using 32 registers each and 122880 bytes of shared memory does not fit on one "
            "multiprocessor");
  // Kernels that meet grid-wide need cooperative launches or clusters; blocks alone need neither.
  DeviceLimits neither = gpu;
  neither.cooperative_launch = false;
  neither.cluster_launch = false;
  EXPECT_EQ(kernels::fit_of({kernel(64, 0)}, 256, kernels::Cooperation::grid_or_cluster, neither, built).reason,
            "the GPU offers neither cooperative launches nor thread-block clusters");
  EXPECT_TRUE(kernels::fit_of({kernel(64, 0)}, 256, kernels::Cooperation::none, neither, built).runs);
  neither.cluster_launch = true;  // clusters alone will do
  EXPECT_TRUE(kernels::fit_of({kernel(64, 0)}, 256, kernels::Cooperation::grid_or_cluster, neither, built).runs);
}

/// Sets an environment variable for the life of the object (for the ltrain processes tests start).
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnvironment() { ::unsetenv(name_); }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
};

TEST(GpuProfile, AnUnknownNameStopsEveryCommandButTheDoctorWithOneLine) {
  TempDir dir;
  const ScopedEnvironment profile(device::kGpuProfileVariable, "rtx4080");
  EXPECT_EQ(run_ltrain("train --config " LTRAIN_SOURCE_DIR "/configs/quickstart.json", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out")
                .find("LTRAIN_GPU_PROFILE=\"rtx4080\" names no GPU profile: use one of rtx4090, rtx4090d, rtx5090, "
                      "a100, h100, or unset it"),
            std::string::npos)
      << read_file(dir.path() / "out");
  // The doctor still reports, and names the mistake among its warnings.
  ASSERT_EQ(run_ltrain("doctor --json", dir.path() / "out"), 0) << read_file(dir.path() / "out");
  const nlohmann::json report = nlohmann::json::parse(read_file(dir.path() / "out"));
  EXPECT_EQ(report["gpu_profile"], "rtx4080");
  bool named = false;
  for (const auto& warning : report["warnings"])
    named = named || warning.get<std::string>().find("names no GPU profile") != std::string::npos;
  EXPECT_TRUE(named) << report.dump(2);
}

TEST(GpuProfile, DoctorReportsEachGpusCodeAndFastPaths) {
  TempDir dir;
  ASSERT_EQ(run_ltrain("doctor --json", dir.path() / "out"), 0) << read_file(dir.path() / "out");
  const nlohmann::json report = nlohmann::json::parse(read_file(dir.path() / "out"));
  EXPECT_EQ(report["build"]["cuda_architectures"], device::built_architectures());
  EXPECT_EQ(report["build"]["cuda_architectures"] == "", !compat::built_with_cuda());
  for (const auto& gpu : report["gpus"]) {
    EXPECT_TRUE(gpu["kernel_code"].is_string());
    EXPECT_TRUE(gpu["kernels_load"].is_boolean());
    std::vector<std::string> names;
    for (const auto& path : gpu["fast_paths"]) {
      names.push_back(path["name"]);
      // A path that does not run says why.
      if (!path["active"].get<bool>()) {
        EXPECT_FALSE(path["note"].get<std::string>().empty()) << path.dump();
      }
    }
    EXPECT_EQ(names, (std::vector<std::string>{"ltrain's BatchNorm kernels", "thread-block clusters in them",
                                               "cuDNN's fused BatchNorm", "ltrain's max pooling kernels",
                                               "ltrain's convolutions with BatchNorm statistics (model.fused_conv)",
                                               "ltrain's SGD and inf/NaN check kernels",
                                               "ltrain's cross-entropy kernels", "NCCL for several GPUs"}));
  }
  // The text names the same paths, one line each.
  ASSERT_EQ(run_ltrain("doctor", dir.path() / "out"), 0);
  if (compat::cuda_device_count() > 0) {
    EXPECT_NE(read_file(dir.path() / "out").find("  ltrain's BatchNorm kernels: "), std::string::npos);
    EXPECT_NE(read_file(dir.path() / "out").find("  kernel code: "), std::string::npos);
  }
}

TEST(GpuProfile, DoctorWarnsWhereABuildCarriesNoCodeForAGpu) {
  engine::DoctorReport report;
  report.environment.cuda_build = true;
  report.environment.gpus = {{0, "NVIDIA H200", 9, 0, 132, 150 * kGiB}};
  report.cuda_architectures = "89-real";
  engine::GpuReport gpu;
  gpu.kernels_load = false;
  report.gpus = {gpu};
  const std::vector<std::string> warnings = engine::fast_path_warnings(report);
  ASSERT_FALSE(warnings.empty());
  EXPECT_EQ(warnings[0],
            "GPU 0 (NVIDIA H200, compute capability 9.0): this build carries no code for it (sm_89), so ltrain's own "
            "kernels give way to LibTorch's and cuDNN's: build on this machine with bash scripts/setup.sh, or add 90 "
            "to CMAKE_CUDA_ARCHITECTURES");
  report.gpus[0].kernels_load = true;
  for (const std::string& warning : engine::fast_path_warnings(report))
    EXPECT_EQ(warning.find("carries no code"), std::string::npos) << warning;
}

TEST(GpuMemory, TheFractionIsASettingOfItsOwnWithItsRange) {
  EXPECT_EQ(testing::config_from({}).config.run.gpu_memory_fraction, 1.0);
  EXPECT_EQ(testing::config_from({"run.gpu_memory_fraction=0.25"}).config.run.gpu_memory_fraction, 0.25);
  for (const std::string bad : {"0", "1.5", "-0.1"}) {
    try {
      testing::config_from({"run.gpu_memory_fraction=" + bad});
      ADD_FAILURE() << bad << " was taken";
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find("run.gpu_memory_fraction"), std::string::npos) << error.what();
    }
  }
  // On the CPU it limits nothing.
  EXPECT_EQ(engine::limit_gpu_memory(testing::config_from({"run.gpu_memory_fraction=0.5"}).config, torch::kCPU), -1);
  EXPECT_EQ(engine::describe_gpu_limits(torch::kCPU, -1), "");
}

TEST(GpuMemory, ALimitMakesLargerAllocationsFailAsOutOfMemory_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t total = compat::device_total_memory_bytes(cuda);
  const int64_t limit = engine::limit_gpu_memory(testing::config_from({"run.gpu_memory_fraction=0.05"}).config, cuda);
  EXPECT_NEAR(static_cast<double>(limit), 0.05 * static_cast<double>(total), 1.0);
  EXPECT_EQ(compat::device_memory_bytes(cuda), limit);
  EXPECT_NE(engine::describe_gpu_limits(cuda, limit).find("this process may hold"), std::string::npos);
  // Twice the limit in one tensor: LibTorch's out-of-memory error, as on a card that small.
  try {
    const torch::Tensor too_big = torch::empty({2 * limit}, torch::TensorOptions().dtype(torch::kUInt8).device(cuda));
    ADD_FAILURE() << "an allocation of twice the limit succeeded";
  } catch (const std::exception& error) {
    EXPECT_TRUE(compat::is_out_of_memory(error)) << error.what();
  }
  // Back to the whole GPU, or to the memory of the card a GPU profile plans for.
  const device::GpuProfile* profile = device::active_gpu_profile();
  EXPECT_EQ(engine::limit_gpu_memory(testing::config_from({}).config, cuda),
            profile == nullptr ? total : std::min(total, profile->limits.memory_bytes));
  const torch::Tensor fits = torch::empty({2 * limit}, torch::TensorOptions().dtype(torch::kUInt8).device(cuda));
  EXPECT_EQ(fits.numel(), 2 * limit);
}

}  // namespace
}  // namespace ltrain
