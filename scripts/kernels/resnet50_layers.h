// ResNet-50's distinct convolutions (torchvision v1.5), shared by the convolution micro-benchmarks
// (bench_fused_conv.cu here, experiments/conv_graph/bench_conv_graph.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "ltrain/kernels/conv_shape.h"

namespace ltrain::kernels {

struct Layer {
  ConvShape shape;
  int count;               // how often the network has it
  bool normalized_input;   // its input is a BatchNorm + ReLU output that is read by it alone
};

/// ResNet-50's convolutions for `image_size` x `image_size` inputs: the stem's own (3 input channels
/// padded to 8), then the stages' from layer1 on, which the imagenet stem (7x7 stride 2, max pool
/// stride 2) enters at a quarter of the image side and the cifar stem (3x3 stride 1) at the full side.
inline std::vector<Layer> resnet50_layers(int64_t batch, int64_t image_size, bool imagenet_stem) {
  std::vector<Layer> layers;
  int64_t side = imagenet_stem ? image_size / 4 : image_size;
  auto add = [&](ConvShape s, bool normalized) {
    for (Layer& l : layers)
      if (l.shape == s && l.normalized_input == normalized) {
        ++l.count;
        return;
      }
    layers.push_back({s, 1, normalized});
  };
  if (imagenet_stem) add({batch, 8, image_size, image_size, 64, 7, 2, 3}, false);
  else add({batch, 8, image_size, image_size, 64, 3, 1, 1}, false);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = 64LL << stage, out = planes * 4;
    for (int block = 0; block < blocks[stage]; ++block) {
      const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
      const int64_t out_side = (side + stride - 1) / stride;
      add({batch, in, side, side, planes, 1, 1, 0}, false);
      add({batch, planes, side, side, planes, 3, stride, 1}, true);
      add({batch, planes, out_side, out_side, out, 1, 1, 0}, true);
      if (block == 0) add({batch, in, side, side, out, 1, stride, 0}, false);
      in = out;
      side = out_side;
    }
  }
  return layers;
}

}  // namespace ltrain::kernels
