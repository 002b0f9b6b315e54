#pragma once
// Which code of a build the CUDA driver loads on a GPU: the architectures the build carries, in
// CMake's spelling, and the image a GPU of a given compute capability takes from them. Plain C++,
// so that the choice is tested on any machine.
#include <string>
#include <string_view>
#include <vector>

#include "ltrain/device/limits.h"

namespace ltrain::device {

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

}  // namespace ltrain::device
