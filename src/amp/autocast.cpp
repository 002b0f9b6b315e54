#include "ltrain/amp/autocast.h"

#include <ATen/autocast_mode.h>

#include "ltrain/core/torch_compat.h"

namespace ltrain::amp {

#if LTRAIN_TORCH_HAS_DEVICE_TYPE_AUTOCAST
bool autocast_enabled(torch::DeviceType device_type) { return at::autocast::is_autocast_enabled(device_type); }
torch::ScalarType autocast_dtype(torch::DeviceType device_type) {
  return at::autocast::get_autocast_dtype(device_type);
}
#else
bool autocast_enabled(torch::DeviceType device_type) {
  return device_type == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
torch::ScalarType autocast_dtype(torch::DeviceType device_type) {
  return device_type == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
#endif
bool autocast_cache_enabled() { return at::autocast::is_autocast_cache_enabled(); }
void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

namespace {
void set_autocast(torch::DeviceType device_type, bool enabled, torch::ScalarType dtype) {
#if LTRAIN_TORCH_HAS_DEVICE_TYPE_AUTOCAST
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == torch::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}
}  // namespace

AutocastGuard::AutocastGuard(torch::DeviceType device_type, torch::ScalarType dtype, bool enabled)
    : device_type_(device_type), active_(enabled) {
  if (!active_) return;
  previous_enabled_ = autocast_enabled(device_type_);
  previous_dtype_ = autocast_dtype(device_type_);
  set_autocast(device_type_, true, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The outermost guard drops the cache of casted weights, as torch.autocast.__exit__ does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast(device_type_, previous_enabled_, previous_dtype_);
}

}  // namespace ltrain::amp
