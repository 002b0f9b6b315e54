#pragma once
// The shape of one 2-D convolution, shared by the kernels that describe convolutions without
// LibTorch (kernels/fused_conv.h on CUTLASS; experiments/conv_graph/ on cuDNN's graph API).
#include <cstdint>

namespace ltrain::kernels {

/// A 2-D convolution without bias, dilation 1, one group: x [batch, in_channels, height, width] ->
/// y [batch, out_channels, out_height(), out_width()].
struct ConvShape {
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t out_channels = 0;
  int64_t kernel = 1;  ///< square kernel side
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  int64_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
  bool operator==(const ConvShape& o) const {
    return batch == o.batch && in_channels == o.in_channels && height == o.height && width == o.width &&
           out_channels == o.out_channels && kernel == o.kernel && stride == o.stride && padding == o.padding;
  }
};

}  // namespace ltrain::kernels
