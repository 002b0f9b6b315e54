#pragma once
// A module's tensors under PyTorch's names: its parameters as the optimizer and checkpoints name
// them, its state_dict, and weights copied into it by name.
#include <string>

#include <torch/torch.h>

#include "ltrain/core/named_tensors.h"

namespace ltrain::engine {

/// Named parameters in registration order, as the optimizer and checkpoints name them.
NamedTensors named_parameters(const torch::nn::Module& module);

/// Parameters and buffers in PyTorch's state_dict order (a module's own parameters, then its own
/// buffers, then its children's), with PyTorch's dotted names.
NamedTensors state_dict(const torch::nn::Module& module);

/// Copies `tensors` (state_dict names) into `module`'s parameters and buffers. DataError naming
/// `source` and the first missing, unexpected or misshapen tensor.
void load_state_dict(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source);

}  // namespace ltrain::engine
