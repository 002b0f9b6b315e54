#pragma once
// Tensors with names, in a meaningful order: a model's state_dict, optimizer state, the contents
// of a safetensors file or a checkpoint. One type for all of them, so they pass between layers
// without conversion.
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace ltrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// The tensor named `name` in `tensors`, or nullptr.
const torch::Tensor* find_tensor(const NamedTensors& tensors, const std::string& name);

}  // namespace ltrain
