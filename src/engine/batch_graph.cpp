#include "ltrain/engine/batch_graph.h"

#include <stdexcept>

namespace ltrain::engine {

void BatchGraph::run(const data::Batch& batch, const Work& work) {
  if (batch.images.sizes() != torch::IntArrayRef(shape_)) {
    // A new shape: the warm-up runs again before the next capture (cuDNN, when it autotunes,
    // times its convolutions for the new shapes there). The old graph and its memory pool go
    // first, so that two never hold memory at once.
    graph_.reset();
    images_ = torch::Tensor();
    labels_ = torch::Tensor();
    shape_ = batch.images.sizes().vec();
    warmup_runs_left_ = warmup_runs_;
  }
  if (warmup_runs_left_ > 0) {
    gpu::run_on_side_stream(batch.images.device(), [&] { work(batch.images, batch.labels); });
    --warmup_runs_left_;
    return;
  }
  if (!graph_) {
    images_ = torch::empty_like(batch.images, batch.images.options(), format_);
    labels_ = torch::empty_like(batch.labels);
    auto graph = std::make_unique<gpu::CudaGraph>();
    graph->capture(batch.images.device(), [&] { work(images_, labels_); }, capture_priority_);
    graph_ = std::move(graph);
    ++captures_;
  }
  // The images' shape is the graph's (a new one started over above); the labels must match them.
  if (batch.labels.sizes() != labels_.sizes())
    throw std::logic_error("BatchGraph: a captured graph was given labels of another shape than its images'");
  images_.copy_(batch.images);
  labels_.copy_(batch.labels);
  graph_->replay();
}

}  // namespace ltrain::engine
