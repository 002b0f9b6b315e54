#pragma once
// A CUDA graph of work on one batch: the first calls run the work eagerly on a side stream (the
// warm-up PyTorch asks for before a capture: cuDNN autotuning, lazy set-up), the next captures it
// once over static copies of a batch's images and labels, and every call from then on copies its
// batch into them and replays. The training step and evaluation both run their work this way.
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

  /// `warmup_runs` eager calls before the capture; the static images are kept in `format`.
  BatchGraph(int64_t warmup_runs, torch::MemoryFormat format) : warmup_runs_left_(warmup_runs), format_(format) {}

  /// Runs `work` on `batch`: eagerly during the warm-up, then through the graph (captured at the
  /// first call after the warm-up; nothing the capture records runs until its replay). logic_error
  /// for a batch of another shape than the captured one.
  void run(const data::Batch& batch, const Work& work);

  bool captured() const { return graph_ != nullptr; }

 private:
  int64_t warmup_runs_left_;
  torch::MemoryFormat format_;
  std::unique_ptr<gpu::CudaGraph> graph_;
  torch::Tensor images_;  // [B,3,32,32] float32, in format_
  torch::Tensor labels_;  // [B] int64
};

}  // namespace ltrain::engine
