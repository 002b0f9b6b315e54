#include "ltrain/amp/autocast.h"

#include "ltrain/core/torch_compat.h"

namespace ltrain::amp {

AutocastGuard::AutocastGuard(torch::DeviceType device_type, torch::ScalarType dtype, bool enabled)
    : device_type_(device_type), active_(enabled) {
  if (!active_) return;
  previous_enabled_ = compat::autocast_enabled(device_type_);
  previous_dtype_ = compat::autocast_dtype(device_type_);
  compat::set_autocast(device_type_, true, dtype);
  compat::autocast_increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The outermost guard drops the cache of casted weights, as torch.autocast.__exit__ does.
  if (compat::autocast_decrement_nesting() == 0) compat::autocast_clear_cache();
  compat::set_autocast(device_type_, previous_enabled_, previous_dtype_);
}

}  // namespace ltrain::amp
