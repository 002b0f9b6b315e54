#pragma once
// Activation checkpointing of a run of residual blocks, through a custom autograd function: the
// forward pass keeps only the segment's input; the backward pass runs the blocks again (under the
// autocast state of the forward pass) and back-propagates through that recomputation. The
// BatchNorm running statistics that the recomputation would update a second time are restored,
// so they move once per step, as without checkpointing.
#include <memory>
#include <vector>

#include <torch/torch.h>

namespace ltrain::models {

class ResidualBlockImpl;
using BlockSegment = std::vector<std::shared_ptr<ResidualBlockImpl>>;

/// The blocks of `segment` applied in order to x.
torch::Tensor run_segment(const BlockSegment& segment, torch::Tensor x);

/// run_segment with its activations recomputed in the backward pass. `segment` must outlive the
/// backward pass (the model holds it).
torch::Tensor checkpointed_segment(const BlockSegment& segment, const torch::Tensor& x);

/// checkpoint_sequential's split of `blocks` into `segments` runs: segments - 1 of
/// blocks.size() / segments blocks each, then the rest (the last run is not checkpointed).
std::vector<BlockSegment> split_into_segments(const BlockSegment& blocks, int64_t segments);

}  // namespace ltrain::models
