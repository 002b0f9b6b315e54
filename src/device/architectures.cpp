#include "ltrain/device/architectures.h"

#include <optional>

#include <fmt/format.h>

namespace ltrain::device {
namespace {

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

}  // namespace ltrain::device
