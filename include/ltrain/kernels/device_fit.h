#pragma once
// Whether ltrain's own CUDA kernels can run on a GPU, decided from plain numbers: the GPU's limits
// (device/limits.h), the architectures the build carries (device/architectures.h) and what the
// driver reports of each kernel. Plain C++ (no CUDA headers), so that the decisions are tested on
// any machine; the CUDA side (kernels/device_limits.h) reads the numbers from the driver and
// src/kernels/*.cu act on them.
#include <cstdint>
#include <string>
#include <vector>

#include "ltrain/device/architectures.h"
#include "ltrain/device/limits.h"

namespace ltrain::kernels {

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
int resident_blocks_per_multiprocessor(const KernelFacts& kernel, int threads, const device::DeviceLimits& limits);

/// The answer of the fit functions below and of each family's (kernels/*.h), in the device
/// module's words.
using device::KernelFit;

/// Whether `kernel` may run in thread-block clusters: the GPU has them (compute capability 9.0 and
/// later, and the active profile's card too) and the kernel's code was compiled for sm_90 or later
/// (code for earlier targets has no cluster instructions: ltrain's cluster kernels trap there).
KernelFit cluster_fit(const KernelFacts& kernel, const device::DeviceLimits& limits);
bool takes_clusters(const KernelFacts& kernel, const device::DeviceLimits& limits);

/// How a family's kernels meet: grid-wide (cooperative launch or clusters, as the BatchNorm
/// kernels), or each block alone.
enum class Cooperation { none, grid_or_cluster };

/// Whether every kernel of a family (`kernels`, each launched with `threads` threads a block) runs
/// on a GPU with `limits`: each loaded (else "no kernel image for compute capability X.Y in this
/// build (it carries ...)", naming `built`), at least one block of each resident, and where the
/// kernels meet grid-wide, cooperative launches or clusters.
KernelFit fit_of(const std::vector<KernelFacts>& kernels, int threads, Cooperation cooperation,
                 const device::DeviceLimits& limits, const std::vector<device::CompiledArchitecture>& built);

}  // namespace ltrain::kernels
