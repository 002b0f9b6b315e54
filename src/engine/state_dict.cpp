#include "ltrain/engine/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/core/errors.h"

namespace ltrain::engine {

NamedTensors named_parameters(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

namespace {
void collect_state(const torch::nn::Module& module, const std::string& prefix, NamedTensors& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.emplace_back(prefix + item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) out.emplace_back(prefix + item.key(), item.value());
  for (const auto& child : module.named_children()) collect_state(*child.value(), prefix + child.key() + ".", out);
}
}  // namespace

NamedTensors state_dict(const torch::nn::Module& module) {
  NamedTensors out;
  collect_state(module, "", out);
  return out;
}

void load_state_dict(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source) {
  const NamedTensors targets = state_dict(module);
  for (const auto& [name, value] : tensors) {
    if (!find_tensor(targets, name))
      throw DataError(fmt::format("{}: unexpected tensor \"{}\": the weights are for another model (check model.arch, "
                                  "model.stem, model.width)",
                                  source, name));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    const torch::Tensor* stored = find_tensor(tensors, name);
    if (!stored)
      throw DataError(fmt::format("{}: missing tensor \"{}\": the weights are for another model (check model.arch, "
                                  "model.stem, model.width)",
                                  source, name));
    if (stored->sizes() != target.sizes())
      throw DataError(fmt::format("{}: tensor \"{}\" has shape [{}], the model expects [{}] (check model.num_classes "
                                  "and model.width)",
                                  source, name, fmt::join(stored->sizes(), ", "), fmt::join(target.sizes(), ", ")));
    target.copy_(*stored);
  }
}

}  // namespace ltrain::engine
