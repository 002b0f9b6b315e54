#include "ltrain/kernels/device_fit.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

namespace ltrain::kernels {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kGiB = int64_t{1} << 30;

/// "86-real", "120", "90a-virtual" as one entry; nullopt for anything else.
std::optional<CompiledArchitecture> parse_entry(std::string_view entry) {
  CompiledArchitecture architecture;
  size_t digits = 0;
  while (digits < entry.size() && entry[digits] >= '0' && entry[digits] <= '9') ++digits;
  if (digits < 2 || digits > 3) return std::nullopt;
  for (size_t i = 0; i < digits; ++i) architecture.code = architecture.code * 10 + (entry[i] - '0');
  std::string_view rest = entry.substr(digits);
  if (!rest.empty() && (rest.front() == 'a' || rest.front() == 'f')) {
    architecture.variant = rest.front();
    rest.remove_prefix(1);
  }
  if (rest.empty()) {
    architecture.machine_code = architecture.ptx = true;
  } else if (rest == "-real") {
    architecture.machine_code = true;
  } else if (rest == "-virtual") {
    architecture.ptx = true;
  } else {
    return std::nullopt;
  }
  return architecture;
}

std::string sm_name(const CompiledArchitecture& architecture) {
  return architecture.variant == 0 ? fmt::format("{}", architecture.code)
                                   : fmt::format("{}{}", architecture.code, architecture.variant);
}

/// Whether machine code for `architecture` runs on a GPU of capability `gpu`: same major version
/// and a minor not above the GPU's; an 'a' build only on exactly its capability.
bool machine_code_runs_on(const CompiledArchitecture& architecture, ComputeCapability gpu) {
  if (architecture.code / 10 != gpu.major) return false;
  if (architecture.variant == 'a') return architecture.code == gpu.code();
  return architecture.code % 10 <= gpu.minor;
}

/// PTX for `architecture` compiles for a GPU of capability `gpu` at or above it ('a' and 'f' PTX
/// only within the same capability or family).
bool ptx_compiles_for(const CompiledArchitecture& architecture, ComputeCapability gpu) {
  if (architecture.variant == 'a') return architecture.code == gpu.code();
  if (architecture.variant == 'f') return architecture.code / 10 == gpu.major && architecture.code % 10 <= gpu.minor;
  return architecture.code <= gpu.code();
}

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

int64_t ceil_to(int64_t value, int64_t unit) { return (value + unit - 1) / unit * unit; }

}  // namespace

std::vector<CompiledArchitecture> parse_architectures(std::string_view list) {
  std::vector<CompiledArchitecture> architectures;
  while (!list.empty()) {
    const size_t end = list.find_first_of(";,");
    const std::string_view entry = list.substr(0, end);
    list = end == std::string_view::npos ? std::string_view{} : list.substr(end + 1);
    if (entry.empty()) continue;
    const std::optional<CompiledArchitecture> parsed = parse_entry(entry);
    if (!parsed) return {};
    architectures.push_back(*parsed);
  }
  return architectures;
}

std::string describe_architectures(const std::vector<CompiledArchitecture>& architectures) {
  std::string machine_code, ptx;
  for (const CompiledArchitecture& architecture : architectures) {
    if (architecture.machine_code) machine_code += (machine_code.empty() ? "sm_" : ", sm_") + sm_name(architecture);
    if (architecture.ptx) ptx += (ptx.empty() ? "PTX compute_" : ", PTX compute_") + sm_name(architecture);
  }
  if (machine_code.empty()) return ptx.empty() ? "no CUDA architecture" : ptx;
  return ptx.empty() ? machine_code : machine_code + " + " + ptx;
}

std::string built_architectures() { return LTRAIN_CUDA_ARCHITECTURES; }

KernelImageChoice image_for(ComputeCapability gpu, const std::vector<CompiledArchitecture>& architectures) {
  KernelImageChoice best;
  for (const CompiledArchitecture& architecture : architectures)
    if (architecture.machine_code && machine_code_runs_on(architecture, gpu) &&
        (best.kind == ImageKind::none || architecture.code > best.architecture.code))
      best = {ImageKind::machine_code, architecture};
  if (best.kind != ImageKind::none) return best;
  for (const CompiledArchitecture& architecture : architectures)
    if (architecture.ptx && ptx_compiles_for(architecture, gpu) &&
        (best.kind == ImageKind::none || architecture.code > best.architecture.code))
      best = {ImageKind::ptx, architecture};
  return best;
}

std::string describe_image(const KernelImageChoice& choice) {
  switch (choice.kind) {
    case ImageKind::machine_code: return fmt::format("sm_{} machine code", sm_name(choice.architecture));
    case ImageKind::ptx:
      return fmt::format("PTX compute_{}, compiled for this GPU when loaded", sm_name(choice.architecture));
    case ImageKind::none: break;
  }
  return "no image";
}

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

const GpuProfile* active_gpu_profile() {
  static const GpuProfile* const profile = [] {
    const char* value = std::getenv(kGpuProfileVariable);
    return value == nullptr ? nullptr : find_gpu_profile(value);
  }();
  return profile;
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

int resident_blocks_per_multiprocessor(const KernelFacts& kernel, int threads, const DeviceLimits& limits) {
  if (!kernel.loaded || threads <= 0 || threads > kernel.max_threads_per_block) return 0;
  constexpr int kWarp = 32;
  constexpr int64_t kRegisterUnit = 256;          // registers are allocated per warp in these units
  constexpr int64_t kReservedSharedMemory = kKiB;  // kept by the hardware for each resident block
  const int64_t warps = (threads + kWarp - 1) / kWarp;
  const int64_t registers_per_block =
      warps * ceil_to(static_cast<int64_t>(std::max(kernel.registers_per_thread, 1)) * kWarp, kRegisterUnit);
  const int64_t shared_per_block = kernel.static_shared_memory + kReservedSharedMemory;
  const int64_t blocks = std::min({static_cast<int64_t>(limits.threads_per_multiprocessor) / (warps * kWarp),
                                   static_cast<int64_t>(limits.registers_per_multiprocessor) / registers_per_block,
                                   limits.shared_memory_per_multiprocessor / shared_per_block,
                                   static_cast<int64_t>(limits.blocks_per_multiprocessor)});
  return static_cast<int>(std::max<int64_t>(blocks, 0));
}

KernelFit cluster_fit(const KernelFacts& kernel, const DeviceLimits& limits) {
  if (!kernel.loaded) return {false, "the kernel has no image for this GPU"};
  if (limits.capability.major < 9)
    return {false, fmt::format("compute capability {}.{} has no thread-block clusters (9.0 and later have them)",
                               limits.capability.major, limits.capability.minor)};
  if (!limits.cluster_launch)
    return {false, limits.profile.empty()
                       ? std::string("the GPU does not offer cluster launches")
                       : fmt::format("{}={} plans for a card without them", kGpuProfileVariable, limits.profile)};
  if (kernel.ptx_version < 90)
    return {false, fmt::format("the code loaded was compiled for compute_{}, which has no cluster instructions "
                               "(build for sm_90 or later)",
                               kernel.ptx_version)};
  return {true, ""};
}

bool takes_clusters(const KernelFacts& kernel, const DeviceLimits& limits) { return cluster_fit(kernel, limits).runs; }

KernelFit fit_of(const std::vector<KernelFacts>& kernels, int threads, Cooperation cooperation,
                 const DeviceLimits& limits, const std::vector<CompiledArchitecture>& built) {
  const ComputeCapability gpu = limits.capability;
  for (const KernelFacts& kernel : kernels) {
    if (!kernel.loaded)
      return {false, fmt::format("no kernel image for compute capability {}.{} in this build (it carries {})",
                                 gpu.major, gpu.minor, describe_architectures(built))};
    if (resident_blocks_per_multiprocessor(kernel, threads, limits) < 1)
      return {false, fmt::format("a block of {} threads using {} registers each and {} bytes of shared memory does "
                                 "not fit on one multiprocessor",
                                 threads, kernel.registers_per_thread, kernel.static_shared_memory)};
  }
  if (cooperation == Cooperation::grid_or_cluster && !limits.cooperative_launch &&
      std::none_of(kernels.begin(), kernels.end(),
                   [&](const KernelFacts& kernel) { return takes_clusters(kernel, limits); }))
    return {false, "the GPU offers neither cooperative launches nor thread-block clusters"};
  return {true, ""};
}

}  // namespace ltrain::kernels
