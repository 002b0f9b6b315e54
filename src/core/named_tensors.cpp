#include "ltrain/core/named_tensors.h"

#include <algorithm>

namespace ltrain {

const torch::Tensor* find_tensor(const NamedTensors& tensors, const std::string& name) {
  const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& entry) { return entry.first == name; });
  return it == tensors.end() ? nullptr : &it->second;
}

}  // namespace ltrain
