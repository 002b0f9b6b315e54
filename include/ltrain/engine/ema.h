#pragma once
// An exponential moving average of a model's weights (optim.ema_decay), as PyTorch's
// AveragedModel(use_buffers=True) with an EMA rule: after every optimizer step,
// average = decay * average + (1 - decay) * value, for every floating-point parameter and buffer
// (BatchNorm's running statistics too). Integer buffers (batch counters) are not averaged: the
// model's own are used. Training runs on the model's weights; evaluation on the average.
#include <filesystem>
#include <vector>

#include <torch/torch.h>

#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

class Ema {
 public:
  /// Starts equal to the model's current values. The model must outlive it; its tensors must
  /// keep their addresses (they do through load_state_dict and graph capture).
  Ema(torch::nn::Module& model, double decay);

  /// One update after an optimizer step: two multi-tensor kernels, no host sync.
  void update();

  /// While alive, the model's tensors hold the average (copied in place, so a captured
  /// evaluation graph sees it); the model's own values come back on destruction.
  class Applied {
   public:
    explicit Applied(Ema& average);
    ~Applied();
    Applied(const Applied&) = delete;
    Applied& operator=(const Applied&) = delete;

   private:
    Ema& average_;
    std::vector<torch::Tensor> saved_;  // the model's own values
  };

  /// The model's state_dict with the averaged values (integer buffers: the model's), for the
  /// checkpoint's averaged weights and for evaluation and export.
  NamedTensors weights() const;
  /// Takes the averaged values from a checkpoint's averaged weights; DataError naming `file` when
  /// one is missing or has another shape.
  void load(const NamedTensors& averaged, const std::filesystem::path& file);

 private:
  double decay_;
  NamedTensors model_state_;     // the model's state_dict (aliases of its tensors)
  std::vector<size_t> averaged_index_;  // positions in model_state_ of the floating-point entries
  std::vector<torch::Tensor> live_;     // those entries of the model
  std::vector<torch::Tensor> averages_;  // their averages, same shapes, dtypes and devices
};

}  // namespace ltrain::engine
