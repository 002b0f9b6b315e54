#pragma once
// torchvision-compatible ResNets (v1.5: stride on the 3x3 conv of a bottleneck), depths 18-152.
// Parameter and buffer names, their order, shapes and initialization match torchvision's
// resnet18/34/50/101/152, so state dicts move between the two unchanged (io/safetensors).
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "ltrain/config/config.h"

namespace ltrain::models {

/// ResNet: stem -> layer1..layer4 -> global average pool -> fc.
class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const config::ModelSection& options);

  /// [B,3,H,W] float -> logits [B,num_classes] float.
  torch::Tensor forward(torch::Tensor x);

  const config::ModelSection& options() const { return options_; }

 private:
  config::ModelSection options_;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

/// Number of trainable parameter elements (ResNet50, 10 classes: 23,528,522).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace ltrain::models
