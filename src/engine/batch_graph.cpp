#include "ltrain/engine/batch_graph.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace ltrain::engine {

torch::Tensor BatchGraph::static_form(const torch::Tensor& images) const {
  std::vector<int64_t> sizes = images.sizes().vec();
  sizes[1] = std::max(sizes[1], static_images_.channels);
  // at::zeros takes no memory format: empty in the format, then zeroed.
  const torch::Tensor copy = torch::empty(sizes, images.options()
                                                     .dtype(static_images_.dtype.value_or(images.scalar_type()))
                                                     .memory_format(static_images_.format))
                                 .zero_();
  copy.narrow(1, 0, images.size(1)).copy_(images);
  return copy;
}

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
    // On images like the static ones: cuDNN autotunes the convolutions the capture will record.
    gpu::run_on_side_stream(batch.images.device(), [&] { work(static_form(batch.images), batch.labels); });
    --warmup_runs_left_;
    return;
  }
  if (!graph_) {
    images_ = static_form(batch.images);
    labels_ = torch::empty_like(batch.labels);
    auto graph = std::make_unique<gpu::CudaGraph>();
    graph->capture(batch.images.device(), [&] { work(images_, labels_); }, capture_priority_);
    graph_ = std::move(graph);
    ++captures_;
  }
  // The images' shape is the graph's (a new one started over above); the labels must match them.
  if (batch.labels.sizes() != labels_.sizes())
    throw std::logic_error("BatchGraph: a captured graph was given labels of another shape than its images'");
  images_.narrow(1, 0, batch.images.size(1)).copy_(batch.images);
  labels_.copy_(batch.labels);
  graph_->replay();
}

}  // namespace ltrain::engine
