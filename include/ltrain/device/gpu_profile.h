#pragma once
// GPU profiles: LTRAIN_GPU_PROFILE=rtx4090 (or another card's name) makes ltrain plan for that
// card's limits on a larger GPU: its kernels for fewer multiprocessors, less shared memory, no
// thread-block clusters, and the process for the card's memory. It proves the paths such cards
// take on the GPU at hand. The one place that reads the variable, checks it and describes it.
// An environment variable rather than a config key, so that the test binary and every process of
// a run see it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ltrain/device/limits.h"

namespace ltrain::device {

/// A card whose limits LTRAIN_GPU_PROFILE applies.
struct GpuProfile {
  std::string name;  ///< the value of LTRAIN_GPU_PROFILE, e.g. "rtx4090"
  std::string card;  ///< e.g. "NVIDIA GeForce RTX 4090"
  DeviceLimits limits;
};

/// The variable that selects a profile.
constexpr const char* kGpuProfileVariable = "LTRAIN_GPU_PROFILE";

/// Every profile, in the order `--help` texts list them.
const std::vector<GpuProfile>& gpu_profiles();

/// The profile called `name`; null for an unknown name.
const GpuProfile* find_gpu_profile(std::string_view name);

/// "rtx4090, rtx4090d, ...": the names LTRAIN_GPU_PROFILE takes.
std::string gpu_profile_names();

/// LTRAIN_GPU_PROFILE's value in this process, read once; "" when it is unset.
const std::string& gpu_profile_setting();

/// The profile gpu_profile_setting() selects; null when it is "", "none" or unknown (`ltrain`
/// refuses an unknown name at start: check_gpu_profile_setting).
const GpuProfile* active_gpu_profile();

/// What is wrong with `value` as LTRAIN_GPU_PROFILE's value, as one sentence that says what to do;
/// "" for a profile's name and for no profile ("" and "none").
std::string gpu_profile_problem(std::string_view value);

/// ConfigError with gpu_profile_problem(gpu_profile_setting()) where that is not "".
void check_gpu_profile_setting();

/// "LTRAIN_GPU_PROFILE=rtx4090: ltrain plans for an NVIDIA GeForce RTX 4090 (128 multiprocessors,
/// 100 KiB of shared memory each, no thread-block clusters, 24 GiB)": what `profile` imposes.
std::string describe_gpu_profile(const GpuProfile& profile);

/// The limits a kernel may count on when `profile` is applied on `gpu`: the smaller of each number
/// (a profile cannot add multiprocessors a GPU lacks), clusters and cooperative launches only where
/// both have them. The GPU's own capability stays: it decides which code loads.
DeviceLimits within_profile(const DeviceLimits& gpu, const GpuProfile& profile);

/// `memory_bytes` of a GPU, but no more than the active profile's card has.
int64_t memory_within_profile(int64_t memory_bytes);

}  // namespace ltrain::device
