// The device module: which code of a build a GPU loads, and the GPU profiles (their limits, the one
// check of LTRAIN_GPU_PROFILE's value and the one description of what a profile imposes).
#include <gtest/gtest.h>

#include <string>

#include "ltrain/device/architectures.h"
#include "ltrain/device/gpu_profile.h"
#include "support.h"

namespace ltrain {
namespace {

using device::ComputeCapability;
using device::DeviceLimits;

constexpr int64_t kGiB = int64_t{1} << 30;

/// The default list of a build with nvcc 13 (cmake/CudaArchitectures.cmake).
const char* const kDefaultList = "80-real,86-real,89-real,90-real,100-real,120";

std::string loaded_code(ComputeCapability gpu, const std::string& list) {
  return device::describe_image(device::image_for(gpu, device::parse_architectures(list)));
}

TEST(CompiledArchitectures, ReadsCMakeArchitectureLists) {
  const auto list = device::parse_architectures("80-real;86-real,90a-real;120");
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].code, 80);
  EXPECT_TRUE(list[0].machine_code);
  EXPECT_FALSE(list[0].ptx);
  EXPECT_EQ(list[2].variant, 'a');
  EXPECT_TRUE(list[3].machine_code && list[3].ptx);
  EXPECT_EQ(device::describe_architectures(list), "sm_80, sm_86, sm_90a, sm_120 + PTX compute_120");
  EXPECT_EQ(device::describe_architectures(device::parse_architectures("80-virtual")), "PTX compute_80");
  // Words CMake resolves itself, and nonsense, leave the driver as the only judge.
  EXPECT_TRUE(device::parse_architectures("all-major").empty());
  EXPECT_TRUE(device::parse_architectures("native").empty());
  EXPECT_TRUE(device::parse_architectures("86-realish").empty());
  EXPECT_TRUE(device::parse_architectures("").empty());
}

TEST(CompiledArchitectures, PicksTheCodeTheDriverLoadsForEachGpu) {
  // The default build: machine code for every card the guides name, PTX for what comes after.
  EXPECT_EQ(loaded_code({8, 9}, kDefaultList), "sm_89 machine code");  // RTX 4090 / 4090 D
  EXPECT_EQ(loaded_code({12, 0}, kDefaultList), "sm_120 machine code");  // RTX 5090
  EXPECT_EQ(loaded_code({8, 0}, kDefaultList), "sm_80 machine code");  // A100
  EXPECT_EQ(loaded_code({9, 0}, kDefaultList), "sm_90 machine code");  // H100 / H200
  EXPECT_EQ(loaded_code({8, 7}, kDefaultList), "sm_86 machine code");  // same major, highest minor not above
  EXPECT_EQ(loaded_code({10, 3}, kDefaultList), "sm_100 machine code");
  EXPECT_EQ(loaded_code({12, 1}, kDefaultList), "sm_120 machine code");
  EXPECT_EQ(loaded_code({13, 0}, kDefaultList), "PTX compute_120, compiled for this GPU when loaded");
  EXPECT_EQ(loaded_code({7, 5}, kDefaultList), "no image");  // a T4: older than every entry
  // The builds that prove the other paths on an H200: PTX only, and no image at all.
  EXPECT_EQ(loaded_code({9, 0}, "80-virtual"), "PTX compute_80, compiled for this GPU when loaded");
  EXPECT_EQ(loaded_code({9, 0}, "89-real"), "no image");
  // Machine code of another major version never runs; 'a' code only on its exact capability.
  EXPECT_EQ(loaded_code({9, 0}, "86-real;100-real"), "no image");
  EXPECT_EQ(loaded_code({9, 0}, "90a-real"), "sm_90a machine code");
  EXPECT_EQ(loaded_code({10, 0}, "90a-real"), "no image");
  EXPECT_EQ(loaded_code({10, 3}, "100f-virtual"), "PTX compute_100f, compiled for this GPU when loaded");
}

TEST(GpuProfiles, ProfilesNarrowALargerGpuToTheCardsLimits) {
  for (const std::string name : {"rtx4090", "rtx4090d", "rtx5090", "a100", "h100"})
    EXPECT_NE(device::find_gpu_profile(name), nullptr) << name;
  EXPECT_EQ(device::find_gpu_profile("rtx4080"), nullptr);
  EXPECT_EQ(device::gpu_profile_names(), "rtx4090, rtx4090d, rtx5090, a100, h100");

  const DeviceLimits rtx4090 = device::within_profile(testing::h200_limits(), *device::find_gpu_profile("rtx4090"));
  EXPECT_EQ(rtx4090.multiprocessors, 128);
  EXPECT_EQ(rtx4090.shared_memory_per_multiprocessor, 100 * 1024);
  EXPECT_EQ(rtx4090.threads_per_multiprocessor, 1536);
  EXPECT_FALSE(rtx4090.cluster_launch);
  EXPECT_TRUE(rtx4090.cooperative_launch);
  EXPECT_EQ(rtx4090.memory_bytes, 24 * kGiB);
  EXPECT_EQ(rtx4090.capability.code(), 90);  // the GPU's own: it decides which code loads
  EXPECT_EQ(rtx4090.profile, "rtx4090");
  EXPECT_EQ(device::within_profile(testing::h200_limits(), *device::find_gpu_profile("rtx4090d")).multiprocessors, 114);
  // A profile cannot add what the GPU lacks: the 5090's 170 multiprocessors are 132 on an H200.
  const DeviceLimits rtx5090 = device::within_profile(testing::h200_limits(), *device::find_gpu_profile("rtx5090"));
  EXPECT_EQ(rtx5090.multiprocessors, 132);
  EXPECT_EQ(rtx5090.memory_bytes, 32 * kGiB);
  EXPECT_TRUE(rtx5090.cluster_launch);
}

TEST(GpuProfiles, AnUnknownNameIsOneSentenceThatSaysWhatToDo) {
  EXPECT_EQ(device::gpu_profile_problem("rtx4080"),
            "LTRAIN_GPU_PROFILE=\"rtx4080\" names no GPU profile: use one of rtx4090, rtx4090d, rtx5090, a100, "
            "h100, or unset it");
  // A profile's name, and no profile at all, are fine.
  for (const std::string fine : {"rtx4090", "h100", "", "none"})
    EXPECT_EQ(device::gpu_profile_problem(fine), "") << fine;
}

TEST(GpuProfiles, DescribesWhatAProfileImposesInOneLine) {
  EXPECT_EQ(device::describe_gpu_profile(*device::find_gpu_profile("rtx4090")),
            "LTRAIN_GPU_PROFILE=rtx4090: ltrain plans for an NVIDIA GeForce RTX 4090 (128 multiprocessors, 100 KiB of "
            "shared memory each, no thread-block clusters, 24 GiB)");
  EXPECT_EQ(device::describe_gpu_profile(*device::find_gpu_profile("h100")),
            "LTRAIN_GPU_PROFILE=h100: ltrain plans for an NVIDIA H100 80GB HBM3 (132 multiprocessors, 228 KiB of "
            "shared memory each, with thread-block clusters, 80 GiB)");
}

TEST(GpuProfiles, MemoryStaysWithinTheActiveProfilesCard) {
  // The test binary runs with or without LTRAIN_GPU_PROFILE (scripts/gpu/portability.sh sets it).
  const device::GpuProfile* profile = device::active_gpu_profile();
  EXPECT_EQ(device::memory_within_profile(150 * kGiB), profile == nullptr ? 150 * kGiB : profile->limits.memory_bytes);
  EXPECT_EQ(device::memory_within_profile(kGiB), kGiB);
}

}  // namespace
}  // namespace ltrain
