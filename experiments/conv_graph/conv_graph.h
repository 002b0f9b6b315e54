#pragma once
// Convolutions as cuDNN backend graphs, with the BatchNorm work that can ride along with them:
// - a prologue that applies relu(x * scale[c] + bias[c]) to the input as the convolution loads it
//   (the previous BatchNorm and its ReLU, never written to memory), in the forward and the weight
//   gradient;
// - an epilogue that sums the output and its squares per channel in float32 (the next
//   BatchNorm's statistics, without a pass of its own).
// cuDNN builds such graphs from its runtime-fusion engines where it has them for the GPU, the
// element type and the shape; a graph it has no engine for is refused when it is built (the
// caller keeps its unfused operators). Plain C++ on cudnn.h (no LibTorch headers, and none
// of cuDNN's in this header); tensors are NHWC (channels_last), weights KRSC, fully packed.
// bench_conv_graph.cu (beside this file) times them against the plain convolution (docs/BENCHMARKS.md).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ltrain/kernels/conv_shape.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// Which gradient or value a graph computes.
enum class ConvPass { forward, backward_data, backward_filter };

/// What rides along with the convolution.
struct ConvFusion {
  /// relu(x * scale + bias) on x as it is loaded; forward and backward_filter only. scale and bias
  /// are [in_channels], of the type ConvGraph::scale_bias_type() names.
  bool input_scale_bias_relu = false;
  /// Per-channel sum and sum of squares of y, float32 [out_channels]; forward only.
  bool output_statistics = false;
  bool operator==(const ConvFusion& other) const {
    return input_scale_bias_relu == other.input_scale_bias_relu && output_statistics == other.output_statistics;
  }
};

/// The device memory one execution reads and writes; a graph uses the ones its pass and fusion name.
struct ConvBuffers {
  const void* x = nullptr;         ///< forward, backward_filter: [batch, in_channels, height, width]
  const void* weight = nullptr;    ///< forward, backward_data: [out_channels, in_channels, kernel, kernel]
  void* y = nullptr;               ///< forward: written
  const void* grad_y = nullptr;    ///< backward_data, backward_filter
  void* grad_x = nullptr;          ///< backward_data: written
  void* grad_weight = nullptr;     ///< backward_filter: written (the element type)
  const void* scale = nullptr;     ///< input_scale_bias_relu
  const void* bias = nullptr;
  float* sum = nullptr;            ///< output_statistics: written
  float* square_sum = nullptr;
};

/// One finalized execution plan of one graph: built once per shape, run many times (also while a
/// CUDA graph captures the stream). cuDNN handles are ltrain's own, one per thread and device.
class ConvGraph {
 public:
  ~ConvGraph();
  ConvGraph(const ConvGraph&) = delete;
  ConvGraph& operator=(const ConvGraph&) = delete;

  /// The plans cuDNN's heuristics offer for the graph (each one an engine that finalized for this
  /// GPU and shape): for each way of typing the prologue that cuDNN takes (float32 or the tensors'
  /// type for scale, bias and the activation), at most `limit`, in the heuristics' order. Which
  /// is fastest differs by shape: time them. Empty, with *why_not saying why, when none
  /// finalizes. Engines that compile at run time do so here, taking up to seconds each.
  /// For the current device.
  static std::vector<std::unique_ptr<ConvGraph>> candidates(ElementType type, ConvPass pass, const ConvShape& shape,
                                                            const ConvFusion& fusion, int limit, std::string* why_not);

  /// Enqueues the graph on `stream` of the device it was built for. `workspace`: workspace_bytes()
  /// of device memory. Returns "" or what failed.
  std::string run(const ConvBuffers& buffers, void* workspace, cudaStream_t stream) const;

  int64_t workspace_bytes() const { return workspace_bytes_; }
  /// The element type of scale and bias: float32 where an engine takes it, else the tensors' type.
  ElementType scale_bias_type() const { return scale_bias_type_; }
  /// "engine 12, compiled at run time": which engine runs, for logs and benchmarks.
  const std::string& engine() const { return engine_; }

 private:
  ConvGraph() = default;
  /// A finalized plan of engine configuration `config` (a cudnnBackendDescriptor_t) on `handle`, or
  /// null where the engine refuses the graph.
  static std::unique_ptr<ConvGraph> make_plan(void* handle, void* config);
  std::shared_ptr<void> descriptors_;  // the graph's tensors, operations and configurations
  void* plan_ = nullptr;               // cudnnBackendDescriptor_t
  int device_ = 0;
  int64_t workspace_bytes_ = 0;
  ElementType scale_bias_type_ = ElementType::float32;
  std::string engine_;
  ConvPass pass_ = ConvPass::forward;
  ConvFusion fusion_;
};

/// "forward convolution with a scale-bias-ReLU prologue and statistics": for messages.
std::string describe(ConvPass pass, const ConvFusion& fusion);

}  // namespace ltrain::kernels
