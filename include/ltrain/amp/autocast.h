#pragma once
// Autocast as Python's `with torch.autocast(device_type, dtype)`: an RAII guard that enables
// autocast for one device type with a given dtype, counts the nesting, and on exit (also when an
// exception passes through) clears the cast cache if it was the outermost and restores the
// previous state.
#include <torch/torch.h>

namespace ltrain::amp {

class AutocastGuard {
 public:
  /// `enabled` false makes the guard a no-op (fp32 and tf32 runs).
  AutocastGuard(torch::DeviceType device_type, torch::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_type_;
  bool active_;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

}  // namespace ltrain::amp
