#include "ltrain/engine/batch_graph.h"

#include <stdexcept>

namespace ltrain::engine {

void BatchGraph::capture(const data::Batch& like, torch::MemoryFormat format, const Work& work) {
  images_ = torch::empty_like(like.images, like.images.options(), format);
  labels_ = torch::empty_like(like.labels);
  auto graph = std::make_unique<gpu::CudaGraph>();
  graph->capture(like.images.device(), [&] { work(images_, labels_); });
  graph_ = std::move(graph);
}

void BatchGraph::replay(const data::Batch& batch) {
  if (batch.images.sizes() != images_.sizes() || batch.labels.sizes() != labels_.sizes())
    throw std::logic_error("BatchGraph: a captured graph was given a batch of another shape");
  images_.copy_(batch.images);
  labels_.copy_(batch.labels);
  graph_->replay();
}

}  // namespace ltrain::engine
