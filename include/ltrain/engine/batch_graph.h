#pragma once
// A CUDA graph of work on one batch: the first calls run the work eagerly on a side stream (the
// warm-up PyTorch asks for before a capture: cuDNN autotuning, lazy set-up), the next captures it
// once over static copies of a batch's images and labels, and every call from then on copies its
// batch into them and replays. A batch of another shape (progressive resizing) releases the graph
// and starts over: warm-up calls on the new shape, then a new capture. The training step and
// evaluation both run their work this way.
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "ltrain/core/gpu.h"
#include "ltrain/data/loader.h"

namespace ltrain::engine {

class BatchGraph {
 public:
  /// The work on images [B,3,S,S] float32 (or as StaticImages says) and labels [B] int64 (device
  /// work only, no host sync).
  using Work = std::function<void(const torch::Tensor& images, const torch::Tensor& labels)>;

  /// How the graph keeps its static images: in `format`; in `dtype` where given (the work's first
  /// operation would cast them to it anyway: autocast's fp16/bf16 before the stem's convolution),
  /// so that the copy into them rounds as that cast would and the graph holds no cast of its own;
  /// with `channels` channels where more than the batch's, the channels past the batch's zero
  /// (for a first convolution that ignores them: ops::convolution, ops::padded_image_channels).
  struct StaticImages {
    torch::MemoryFormat format = torch::MemoryFormat::Contiguous;
    std::optional<torch::ScalarType> dtype;
    int64_t channels = 0;
  };

  /// `warmup_runs` eager calls before the capture.
  BatchGraph(int64_t warmup_runs, StaticImages static_images)
      : warmup_runs_(warmup_runs), warmup_runs_left_(warmup_runs), static_images_(static_images) {}

  /// Runs `work` on `batch`: eagerly during the warm-up, then through the graph (captured at the
  /// first call after the warm-up; nothing the capture records runs until its replay). A batch
  /// whose shape differs from the last one's starts the warm-up again for the new shape.
  void run(const data::Batch& batch, const Work& work);

  /// The priority of the stream the graphs captured from now on are captured on (gpu::CudaGraph).
  void set_capture_priority(gpu::StreamPriority priority) { capture_priority_ = priority; }
  gpu::StreamPriority capture_priority() const { return capture_priority_; }

  bool captured() const { return graph_ != nullptr; }
  /// The captured graph's images, as the last call left them (undefined before a capture).
  const torch::Tensor& static_images() const { return images_; }
  /// Graphs captured so far (one per run of same-shaped batches).
  int64_t captures() const { return captures_; }

 private:
  /// A copy of `images` [B,3,S,S] as the static images are kept.
  torch::Tensor static_form(const torch::Tensor& images) const;

  int64_t warmup_runs_;
  int64_t warmup_runs_left_;
  int64_t captures_ = 0;
  std::vector<int64_t> shape_;  // the images' shape of the warm-up or graph under way
  StaticImages static_images_;
  gpu::StreamPriority capture_priority_ = gpu::StreamPriority::normal;
  std::unique_ptr<gpu::CudaGraph> graph_;
  torch::Tensor images_;  // [B,C,S,S] as static_images_ says; the batch's images in its first channels
  torch::Tensor labels_;  // [B] int64
};

}  // namespace ltrain::engine
