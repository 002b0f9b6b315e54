#include "ltrain/engine/ema.h"

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/engine/state_dict.h"

namespace ltrain::engine {

Ema::Ema(torch::nn::Module& model, double decay) : decay_(decay), model_state_(state_dict(model)) {
  torch::NoGradGuard no_grad;
  for (size_t index = 0; index < model_state_.size(); ++index) {
    const torch::Tensor& value = model_state_[index].second;
    if (!value.is_floating_point()) continue;
    averaged_index_.push_back(index);
    live_.push_back(value);
    averages_.push_back(value.detach().clone());  // keeps the layout (channels_last weights too)
  }
}

void Ema::update() {
  torch::NoGradGuard no_grad;
  torch::_foreach_mul_(averages_, decay_);
  torch::_foreach_add_(averages_, live_, 1.0 - decay_);
}

Ema::Applied::Applied(Ema& average) : average_(average) {
  torch::NoGradGuard no_grad;
  saved_.reserve(average_.live_.size());
  for (size_t i = 0; i < average_.live_.size(); ++i) {
    saved_.push_back(average_.live_[i].detach().clone());
    average_.live_[i].detach().copy_(average_.averages_[i]);
  }
}

Ema::Applied::~Applied() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < saved_.size(); ++i) average_.live_[i].detach().copy_(saved_[i]);
}

NamedTensors Ema::weights() const {
  NamedTensors out = model_state_;
  for (size_t i = 0; i < averaged_index_.size(); ++i) out[averaged_index_[i]].second = averages_[i];
  return out;
}

void Ema::load(const NamedTensors& averaged, const std::filesystem::path& file) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < averaged_index_.size(); ++i) {
    const std::string& name = model_state_[averaged_index_[i]].first;
    const torch::Tensor* saved = find_tensor(averaged, name);
    if (!saved || saved->sizes() != averages_[i].sizes())
      throw DataError(fmt::format("{}: the averaged weights (optim.ema_decay) lack \"{}\" or have another shape; "
                                  "resume without optim.ema_decay, or start a new run",
                                  file.string(), name));
    averages_[i].copy_(*saved);
  }
}

}  // namespace ltrain::engine
