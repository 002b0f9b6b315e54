#pragma once
// A CUDA graph of work on one batch: captured once over static copies of a batch's images and
// labels, replayed after each new batch is copied into them. The training step and evaluation
// both replay their work this way.
#include <functional>
#include <memory>

#include <torch/torch.h>

#include "ltrain/core/gpu.h"
#include "ltrain/data/loader.h"

namespace ltrain::engine {

class BatchGraph {
 public:
  /// The work on images [B,3,32,32] float32 and labels [B] int64 (device work only, no host sync).
  using Work = std::function<void(const torch::Tensor& images, const torch::Tensor& labels)>;

  bool captured() const { return graph_ != nullptr; }

  /// Captures `work` over buffers shaped like `like` (images in `format`). Nothing runs.
  void capture(const data::Batch& like, torch::MemoryFormat format, const Work& work);

  /// Copies `batch` into the buffers and replays the captured work. logic_error for a batch of
  /// another shape than the captured one.
  void replay(const data::Batch& batch);

 private:
  std::unique_ptr<gpu::CudaGraph> graph_;
  torch::Tensor images_;  // [B,3,32,32] float32
  torch::Tensor labels_;  // [B] int64
};

}  // namespace ltrain::engine
