#pragma once
// Whether ltrain's own CUDA kernels can run on a GPU, decided from plain numbers: the GPU's compute
// capability and limits, the architectures the build carries and what the driver reports of each
// kernel. Plain C++ (no CUDA headers), so that the decisions are tested on any machine; the CUDA
// side (kernels/device_limits.h) reads the numbers from the driver and src/kernels/*.cu act on them.
//
// A GPU profile (LTRAIN_GPU_PROFILE=rtx4090, ...) makes the kernels plan for a smaller card's
// limits on a larger GPU: fewer multiprocessors, less shared memory, no thread-block clusters, and
// the card's memory. It proves the paths such cards take on the GPU at hand.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ltrain::kernels {

/// A GPU's compute capability, e.g. {8, 9} for an RTX 4090.
struct ComputeCapability {
  int major = 0;
  int minor = 0;
  /// 89 for {8, 9}: the number in sm_89.
  int code() const { return major * 10 + minor; }
};

/// One entry of a build's CUDA architecture list, in CMake's CUDA_ARCHITECTURES spelling:
/// "86-real" (machine code), "86-virtual" (PTX), "86" (both), "90a-real" (machine code for exactly
/// 9.0), "100f-real" (machine code for the 10.x family).
struct CompiledArchitecture {
  int code = 0;           ///< 86 for sm_86
  char variant = 0;       ///< 0, 'a' (this capability only) or 'f' (its family: same major, minor >= code's)
  bool machine_code = false;
  bool ptx = false;
};

/// The architecture list LTRAIN_CUDA_ARCHITECTURES names, entries separated by ';' or ','.
/// Words CMake resolves itself ("native", "all", "all-major") and anything unparsable give an
/// empty list: the driver's answer at run time is then the only word on what loads.
std::vector<CompiledArchitecture> parse_architectures(std::string_view list);

/// "sm_80, sm_86, sm_90 + PTX compute_120": what a list carries, for messages.
std::string describe_architectures(const std::vector<CompiledArchitecture>& architectures);

/// The architectures this build's kernels were compiled for, as CMake was given them ("" in a CPU
/// build).
std::string built_architectures();

enum class ImageKind { none, machine_code, ptx };

/// The code the CUDA driver loads for a kernel.
struct KernelImageChoice {
  ImageKind kind = ImageKind::none;
  CompiledArchitecture architecture;
};

/// Which of `architectures` the driver loads on a GPU of capability `gpu`: machine code of the
/// GPU's major version with the highest minor not above the GPU's (an 'a' entry only on its exact
/// capability); else the newest PTX not above the GPU's, compiled when the program loads it; else
/// none.
KernelImageChoice image_for(ComputeCapability gpu, const std::vector<CompiledArchitecture>& architectures);

/// "sm_89 machine code", "PTX compute_80, compiled for this GPU when loaded", "no image".
std::string describe_image(const KernelImageChoice& choice);

/// What ltrain's kernels may count on from a GPU.
struct DeviceLimits {
  ComputeCapability capability;
  int multiprocessors = 0;
  int64_t shared_memory_per_multiprocessor = 0;  ///< bytes
  int registers_per_multiprocessor = 0;
  int threads_per_multiprocessor = 0;
  int blocks_per_multiprocessor = 0;
  bool cooperative_launch = false;
  bool cluster_launch = false;  ///< thread-block clusters (compute capability 9.0 and later)
  int64_t memory_bytes = 0;
  std::string profile;  ///< the GpuProfile these limits were narrowed to (within_profile); "" for none
};

/// A card whose limits LTRAIN_GPU_PROFILE applies.
struct GpuProfile {
  std::string name;  ///< the value of LTRAIN_GPU_PROFILE, e.g. "rtx4090"
  std::string card;  ///< e.g. "NVIDIA GeForce RTX 4090"
  DeviceLimits limits;
};

/// Every profile, in the order `--help` texts list them.
const std::vector<GpuProfile>& gpu_profiles();

/// The profile called `name`; null for an unknown name.
const GpuProfile* find_gpu_profile(std::string_view name);

/// "rtx4090, rtx4090d, ...": the names LTRAIN_GPU_PROFILE takes.
std::string gpu_profile_names();

/// The variable that selects a profile.
constexpr const char* kGpuProfileVariable = "LTRAIN_GPU_PROFILE";

/// The profile LTRAIN_GPU_PROFILE selects in this process (read once); null when it is unset,
/// empty, "none" or unknown (`ltrain` refuses an unknown name at start).
const GpuProfile* active_gpu_profile();

/// The limits a kernel may count on when `profile` is applied on `gpu`: the smaller of each number
/// (a profile cannot add multiprocessors a GPU lacks), clusters and cooperative launches only where
/// both have them. The GPU's own capability stays: it decides which code loads.
DeviceLimits within_profile(const DeviceLimits& gpu, const GpuProfile& profile);

/// What the driver reports of one kernel on the current GPU (cudaFuncGetAttributes).
struct KernelFacts {
  bool loaded = false;         ///< an image for the GPU was found, or compiled from PTX
  int ptx_version = 0;         ///< the virtual architecture it was compiled for, e.g. 90
  int registers_per_thread = 0;
  int64_t static_shared_memory = 0;  ///< bytes per block
  int max_threads_per_block = 0;
};

/// Blocks of `threads` threads of `kernel` that one multiprocessor holds at once within `limits`:
/// the fewest that threads, registers (allocated per warp in units of 256), shared memory (plus the
/// 1 KiB the hardware keeps per block) and the block limit allow. 0 for a kernel not loaded.
int resident_blocks_per_multiprocessor(const KernelFacts& kernel, int threads, const DeviceLimits& limits);

/// Whether a family of kernels runs on a GPU, and if not, why (a phrase for a one-line warning).
struct KernelFit {
  bool runs = false;
  std::string reason;
};

/// Whether `kernel` may run in thread-block clusters: the GPU has them (compute capability 9.0 and
/// later, and the active profile's card too) and the kernel's code was compiled for sm_90 or later
/// (code for earlier targets has no cluster instructions: ltrain's cluster kernels trap there).
KernelFit cluster_fit(const KernelFacts& kernel, const DeviceLimits& limits);
bool takes_clusters(const KernelFacts& kernel, const DeviceLimits& limits);

/// How a family's kernels meet: grid-wide (cooperative launch or clusters, as the BatchNorm
/// kernels), or each block alone.
enum class Cooperation { none, grid_or_cluster };

/// Whether every kernel of a family (`kernels`, each launched with `threads` threads a block) runs
/// on a GPU with `limits`: each loaded (else "no kernel image for compute capability X.Y in this
/// build (it carries ...)", naming `built`), at least one block of each resident, and where the
/// kernels meet grid-wide, cooperative launches or clusters.
KernelFit fit_of(const std::vector<KernelFacts>& kernels, int threads, Cooperation cooperation,
                 const DeviceLimits& limits, const std::vector<CompiledArchitecture>& built);

}  // namespace ltrain::kernels
