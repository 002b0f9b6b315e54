#include "ltrain/device/gpu_profile.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "ltrain/core/errors.h"

namespace ltrain::device {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kGiB = int64_t{1} << 30;

DeviceLimits consumer_card(ComputeCapability capability, int multiprocessors, bool clusters, int blocks_per_sm,
                           int64_t memory_gib) {
  DeviceLimits limits;
  limits.capability = capability;
  limits.multiprocessors = multiprocessors;
  limits.shared_memory_per_multiprocessor = 100 * kKiB;
  limits.registers_per_multiprocessor = 64 * 1024;
  limits.threads_per_multiprocessor = 1536;
  limits.blocks_per_multiprocessor = blocks_per_sm;
  limits.cooperative_launch = true;
  limits.cluster_launch = clusters;
  limits.memory_bytes = memory_gib * kGiB;
  return limits;
}

DeviceLimits data_center_card(ComputeCapability capability, int multiprocessors, int64_t shared_kib, bool clusters,
                              int64_t memory_gib) {
  DeviceLimits limits;
  limits.capability = capability;
  limits.multiprocessors = multiprocessors;
  limits.shared_memory_per_multiprocessor = shared_kib * kKiB;
  limits.registers_per_multiprocessor = 64 * 1024;
  limits.threads_per_multiprocessor = 2048;
  limits.blocks_per_multiprocessor = 32;
  limits.cooperative_launch = true;
  limits.cluster_launch = clusters;
  limits.memory_bytes = memory_gib * kGiB;
  return limits;
}

}  // namespace

const std::vector<GpuProfile>& gpu_profiles() {
  // Limits from NVIDIA's data sheets and the CUDA programming guide's table per compute
  // capability; memory as the cards are sold.
  static const std::vector<GpuProfile> profiles{
      {"rtx4090", "NVIDIA GeForce RTX 4090", consumer_card({8, 9}, 128, false, 24, 24)},
      {"rtx4090d", "NVIDIA GeForce RTX 4090 D", consumer_card({8, 9}, 114, false, 24, 24)},
      {"rtx5090", "NVIDIA GeForce RTX 5090", consumer_card({12, 0}, 170, true, 32, 32)},
      {"a100", "NVIDIA A100 80GB", data_center_card({8, 0}, 108, 164, false, 80)},
      {"h100", "NVIDIA H100 80GB HBM3", data_center_card({9, 0}, 132, 228, true, 80)},
  };
  return profiles;
}

const GpuProfile* find_gpu_profile(std::string_view name) {
  for (const GpuProfile& profile : gpu_profiles())
    if (profile.name == name) return &profile;
  return nullptr;
}

std::string gpu_profile_names() {
  std::string names;
  for (const GpuProfile& profile : gpu_profiles()) names += (names.empty() ? "" : ", ") + profile.name;
  return names;
}

const std::string& gpu_profile_setting() {
  static const std::string value = [] {
    const char* set = std::getenv(kGpuProfileVariable);
    return std::string(set == nullptr ? "" : set);
  }();
  return value;
}

const GpuProfile* active_gpu_profile() {
  static const GpuProfile* const profile = find_gpu_profile(gpu_profile_setting());
  return profile;
}

std::string gpu_profile_problem(std::string_view value) {
  if (value.empty() || value == "none" || find_gpu_profile(value) != nullptr) return "";
  return fmt::format("{}=\"{}\" names no GPU profile: use one of {}, or unset it", kGpuProfileVariable, value,
                     gpu_profile_names());
}

void check_gpu_profile_setting() {
  if (const std::string problem = gpu_profile_problem(gpu_profile_setting()); !problem.empty())
    throw ConfigError(problem);
}

std::string describe_gpu_profile(const GpuProfile& profile) {
  const DeviceLimits& card = profile.limits;
  return fmt::format("{}={}: ltrain plans for an {} ({} multiprocessors, {} KiB of shared memory each, {} "
                     "thread-block clusters, {} GiB)",
                     kGpuProfileVariable, profile.name, profile.card, card.multiprocessors,
                     card.shared_memory_per_multiprocessor / kKiB, card.cluster_launch ? "with" : "no",
                     card.memory_bytes / kGiB);
}

DeviceLimits within_profile(const DeviceLimits& gpu, const GpuProfile& profile) {
  const DeviceLimits& card = profile.limits;
  DeviceLimits limits = gpu;
  limits.multiprocessors = std::min(gpu.multiprocessors, card.multiprocessors);
  limits.shared_memory_per_multiprocessor =
      std::min(gpu.shared_memory_per_multiprocessor, card.shared_memory_per_multiprocessor);
  limits.registers_per_multiprocessor = std::min(gpu.registers_per_multiprocessor, card.registers_per_multiprocessor);
  limits.threads_per_multiprocessor = std::min(gpu.threads_per_multiprocessor, card.threads_per_multiprocessor);
  limits.blocks_per_multiprocessor = std::min(gpu.blocks_per_multiprocessor, card.blocks_per_multiprocessor);
  limits.cooperative_launch = gpu.cooperative_launch && card.cooperative_launch;
  limits.cluster_launch = gpu.cluster_launch && card.cluster_launch;
  limits.memory_bytes = std::min(gpu.memory_bytes, card.memory_bytes);
  limits.profile = profile.name;
  return limits;
}

int64_t memory_within_profile(int64_t memory_bytes) {
  const GpuProfile* profile = active_gpu_profile();
  return profile == nullptr ? memory_bytes : std::min(memory_bytes, profile->limits.memory_bytes);
}

}  // namespace ltrain::device
