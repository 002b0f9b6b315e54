#pragma once
// torchvision-compatible ResNets (v1.5: stride on the 3x3 conv of a bottleneck), depths 18-152,
// and the wide ResNets and ResNeXts built from the same bottleneck with a wider or grouped 3x3 conv.
// Parameter and buffer names, their order, shapes and initialization match torchvision's
// resnet18/34/50/101/152, so state dicts move between the two unchanged (io/safetensors).
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "ltrain/config/enums.h"
#include "ltrain/models/activation_checkpoint.h"
#include "ltrain/ops/batch_norm.h"
#include "ltrain/ops/convolution.h"

namespace ltrain::models {

/// torch.nn.BatchNorm2d(channels) (affine, running statistics, eps 1e-5, momentum 0.1), with the
/// same parameters and buffers in the same order, except that its forward does not count
/// batches: ResNetImpl::forward advances every num_batches_tracked at once, one multi-tensor add
/// per training forward instead of an operator and a kernel per layer. It computes through
/// ops::batch_norm, on the backends the model allows (shared by all its layers).
class BatchNorm2dImpl : public torch::nn::Cloneable<BatchNorm2dImpl> {
 public:
  static constexpr double kEps = 1e-5;
  static constexpr double kMomentum = 0.1;

  /// `backends`: the model's, shared by its layers (default: every backend, no SyncBatchNorm).
  explicit BatchNorm2dImpl(int64_t channels, std::shared_ptr<const ops::BatchNormBackends> backends =
                                                 std::make_shared<const ops::BatchNormBackends>());
  void reset() override;
  /// [B,C,H,W] -> [B,C,H,W]: batch statistics (and running-statistics updates) in training,
  /// running statistics in evaluation.
  torch::Tensor forward(const torch::Tensor& x);
  /// forward(input.y), taking the batch's statistics from input.statistics where they are defined
  /// and the backend uses them (ops::batch_norm). Not an overload of forward(), which Sequential
  /// needs to be unique.
  torch::Tensor forward_with_statistics(const ops::ConvWithStatistics& input);

  /// relu(forward(x) + residual), or relu(forward(x)) with an undefined residual: a ResNet's
  /// BatchNorm-ReLU pairs. In training on CUDA with fp16/bf16 channels_last input, one kernel
  /// each way where the backends allow one (ltrain's, else cuDNN's); otherwise three operators, the
  /// add and the ReLU in place. With `second_output` and a residual, where ltrain's kernel ran,
  /// *second_output becomes a second autograd output with the same values (ops::ltrain_batch_norm);
  /// it is left as it is otherwise.
  torch::Tensor forward_relu(const torch::Tensor& x, const torch::Tensor& residual = {},
                             torch::Tensor* second_output = nullptr);
  /// forward_relu(input.y, ...), taking the batch's statistics from input.statistics where they
  /// are defined and the backend uses them (ops::batch_norm).
  torch::Tensor forward_relu(const ops::ConvWithStatistics& input, const torch::Tensor& residual = {},
                             torch::Tensor* second_output = nullptr);

  /// Whether the convolution before this layer should hand it its output's statistics: the model
  /// asks for them (model.fused_conv) and this layer is training on a backend that uses them.
  bool takes_conv_statistics() const;

  const ops::BatchNormBackends& backends() const { return *backends_; }

  torch::Tensor weight, bias;                                   ///< [C] float32, start at 1 and 0
  torch::Tensor running_mean, running_var, num_batches_tracked;  ///< [C], [C], [] int64

 private:
  /// What ops::batch_norm takes of this layer.
  ops::BatchNormParameters parameters() const;

  int64_t channels_;
  std::shared_ptr<const ops::BatchNormBackends> backends_;
};
TORCH_MODULE(BatchNorm2d);
/// The backends every layer of a model computes on, decided once for the model and shared by its
/// layers.
struct LayerBackends {
  std::shared_ptr<const ops::BatchNormBackends> batch_norm = std::make_shared<const ops::BatchNormBackends>();
  std::shared_ptr<const ops::ConvolutionBackends> convolution = std::make_shared<const ops::ConvolutionBackends>();
};

/// conv(x) through ops::convolution on `backends`, with its output's statistics where `next_norm`
/// (the BatchNorm the output feeds, or null) takes them and ltrain's fused convolution computes
/// them; statistics undefined otherwise.
ops::ConvWithStatistics convolve(const torch::nn::Conv2d& conv, const torch::Tensor& x,
                                 const ops::ConvolutionBackends& backends, const BatchNorm2dImpl* next_norm = nullptr);

/// What a residual block hands the next one: its output `y` for the next block's convolution,
/// and `y_for_shortcut` for the next block's shortcut: the same values, but a second autograd
/// output of the BatchNorm kernel that made y, where ltrain's kernel made it (undefined
/// otherwise). The two gradients then reach that kernel's backward apart, and it adds them as it
/// loads them: no add kernel per block in the backward pass.
struct BlockOutput {
  torch::Tensor y;
  torch::Tensor y_for_shortcut;
  const torch::Tensor& shortcut_input() const { return y_for_shortcut.defined() ? y_for_shortcut : y; }
};

/// One residual block: relu(last_norm(residual_branch(x)) + shortcut(x)). The shortcut is x itself, or
/// `downsample` (1x1 conv with the block's stride + BatchNorm) where the block changes the
/// resolution or the channel count. Each block is one unit of layer1..layer4, the grain at which
/// activation checkpointing can cut the network.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  /// [B,C_in,H,W] -> [B,C_out,H/stride,W/stride].
  torch::Tensor forward(torch::Tensor x);
  /// forward(), reading the previous block's output as BlockOutput describes and handing its own
  /// on the same way.
  BlockOutput forward_block(const BlockOutput& input);

  /// The BatchNorm that ends the residual branch (bn2 basic, bn3 bottleneck): zero_init_residual
  /// starts its weight at 0 so that the block begins as the identity.
  virtual BatchNorm2d& last_norm() = 0;

 protected:
  explicit ResidualBlockImpl(LayerBackends backends) : backends_(std::move(backends)) {}

  /// The residual branch up to its last convolution, before last_norm():
  /// [B,C_in,H,W] -> [B,C_out,H/stride,W/stride], with that convolution's statistics for
  /// last_norm() where it computed them (convolve()).
  virtual ops::ConvWithStatistics residual_branch(torch::Tensor x) = 0;

  /// Registers the projection shortcut (may be empty). Called last by the subclass constructors,
  /// because torchvision registers `downsample` after the branch's convs and norms.
  void register_downsample(torch::nn::Sequential projection);

  /// conv(x) on the model's convolution backends, with statistics for `next_norm` where it takes
  /// them (models::convolve).
  ops::ConvWithStatistics convolve(const torch::nn::Conv2d& conv, const torch::Tensor& x,
                                   const BatchNorm2dImpl* next_norm = nullptr) const {
    return models::convolve(conv, x, *backends_.convolution, next_norm);
  }

  /// The model's, shared by its layers.
  LayerBackends backends_;

 private:
  /// x itself, or downsample(x), its convolution handing its statistics to its BatchNorm where
  /// that takes them.
  torch::Tensor shortcut(const torch::Tensor& x);

  torch::nn::Sequential downsample{nullptr};
};

/// ResNet-18/34 block: 3x3 conv (stride) -> BN -> ReLU -> 3x3 conv -> BN; out = planes channels.
class BasicBlockImpl : public ResidualBlockImpl {
 public:
  /// Output channels per `planes`.
  static constexpr int64_t expansion = 1;

  /// `projection`: the shortcut's conv+BN, or an empty holder when x can be added unchanged.
  BasicBlockImpl(int64_t in_channels, int64_t planes, int64_t stride, torch::nn::Sequential projection,
                 const LayerBackends& backends);

  BatchNorm2d& last_norm() override { return bn2; }

 protected:
  ops::ConvWithStatistics residual_branch(torch::Tensor x) override;

 private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  BatchNorm2d bn1{nullptr}, bn2{nullptr};
};

/// The 3x3 convolution of a bottleneck: torchvision's `groups` and `width_per_group` (ResNet
/// 1 and 64, wide ResNet-50-2 1 and 128, ResNeXt-50 32x4d 32 and 4).
struct BottleneckShape {
  int64_t groups = 1;
  int64_t width_per_group = 64;
  /// The inner channels for `planes`: planes * width_per_group / 64 per group, times groups, as
  /// torchvision computes it (at least one per group, for the narrow test models).
  int64_t inner_channels(int64_t planes) const;
};

/// ResNet-50/101/152 block (v1.5): 1x1 conv -> BN -> ReLU -> 3x3 conv (stride, groups) -> BN ->
/// ReLU -> 1x1 conv -> BN; inner width = shape.inner_channels(planes), out = 4 * planes channels.
class BottleneckImpl : public ResidualBlockImpl {
 public:
  /// Output channels per `planes`.
  static constexpr int64_t expansion = 4;

  /// `projection`: the shortcut's conv+BN, or an empty holder when x can be added unchanged.
  BottleneckImpl(int64_t in_channels, int64_t planes, int64_t stride, torch::nn::Sequential projection,
                 const LayerBackends& backends, BottleneckShape shape = {});

  BatchNorm2d& last_norm() override { return bn3; }

 protected:
  ops::ConvWithStatistics residual_branch(torch::Tensor x) override;

 private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
};

/// What a ResNet is built from and computes on: the model section's keys of the same names that the
/// model reads (model.channels_last and model.init_from are the engine's, which converts the model
/// and loads its weights). No defaults of its own: engine::resnet_options fills every field from
/// config::ModelSection, the one place of the defaults.
struct ResNetOptions {
  config::Arch arch;  ///< torchvision's network of this name
  config::Stem stem;  ///< imagenet: 7x7 stride-2 conv + 3x3 max pool; cifar: 3x3 stride-1 conv
  int64_t num_classes;  ///< fc's outputs
  int64_t width;        ///< channels of the first stage (torchvision: 64)
  bool zero_init_residual;      ///< each residual branch's last BatchNorm starts at weight 0
  int64_t checkpoint_segments;  ///< activation checkpointing: recompute all but the last of N segments; 0: off
  bool ltrain_batch_norm;  ///< BatchNorm may run on ltrain's kernels (ops::BatchNormBackends::ltrain)
  bool cudnn_batch_norm;   ///< BatchNorm may run on cuDNN's fused kernels (ops::BatchNormBackends::cudnn)
  bool ltrain_max_pool;    ///< the imagenet stem's max pooling may run on ltrain's kernels (ops::max_pool2d)
  bool fused_conv;  ///< the large 1x1 convolutions hand their BatchNorm its statistics (ops/fused_conv.h)
};

/// ResNet: stem -> layer1..layer4 -> global average pool -> fc.
/// forward() == forward_head(every block of blocks(), in order, applied to forward_stem(x)).
class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);

  /// [B,3,H,W] float -> logits [B,num_classes] float. Any H,W >= 32; any memory format; images may
  /// carry zero channels past their 3 up to ops::padded_image_channels, which the stem's
  /// convolution ignores (ops::convolution); std::invalid_argument for any other count. With
  /// checkpoint_segments, a training forward with autograd on recomputes the checkpointed
  /// blocks in the backward pass (same values, less memory).
  torch::Tensor forward(torch::Tensor x);

  /// Adds 1 to every BatchNorm's num_batches_tracked (what each torch.nn.BatchNorm2d does in a
  /// training forward). forward() calls it; callers of the stem, blocks and head do it themselves.
  void count_training_batch();

  /// Whether a training forward() calls count_training_batch (yes, at first). A caller that counts
  /// each batch itself elsewhere turns it off: the training step counts on its branch stream,
  /// beside the backward pass, where the counters' kernel waits for nothing (momentum is fixed, so
  /// no forward pass reads them).
  void set_forward_counts_batches(bool counts) { forward_counts_batches_ = counts; }

  /// conv1 + bn1 + ReLU (+ 3x3/2 max-pool for the imagenet stem):
  /// [B,3,H,W] -> [B,width,H/4,W/4] (imagenet) or [B,width,H,W] (cifar).
  torch::Tensor forward_stem(torch::Tensor images);

  /// The side of layer1's feature maps for images of side `image_side`: the stem's output
  /// (imagenet: a stride-2 convolution and a stride-2 max pool; cifar: the images' own side).
  int64_t first_stage_side(int64_t image_side) const;

  /// Global average pool + fc: [B,C,h,w] -> [B,num_classes].
  torch::Tensor forward_head(torch::Tensor features);

  /// layer1..layer4, each a Sequential of residual blocks named "0", "1", ...
  std::vector<torch::nn::Sequential> stages() const;

  /// Every residual block in forward order (layer1.0 ... layer4.N).
  std::vector<std::shared_ptr<ResidualBlockImpl>> blocks() const;

  const ResNetOptions& options() const { return options_; }

  /// Makes every BatchNorm a SyncBatchNorm through `sum_over_ranks` (ops::BatchNormBackends).
  void synchronize_batch_norm(std::function<torch::Tensor(const torch::Tensor&)> sum_over_ranks);

  /// How every convolution of the model runs from now on (ops::ConvolutionBackends); whoever
  /// turns the weight-gradient branch on joins it after each backward pass.
  void set_convolution_backends(const ops::ConvolutionBackends& backends);
  const ops::ConvolutionBackends& convolution_backends() const { return *convolution_backends_; }

 private:
  /// torchvision's init: kaiming-normal (fan_out, relu) convs, BN weight 1 / bias 0, optional zero
  /// last-BN per block. Linear keeps LibTorch's default init (the same as PyTorch's).
  void initialize_weights();

  ResNetOptions options_;
  /// From ltrain_batch_norm, cudnn_batch_norm and fused_conv; every BatchNorm of the model holds it.
  std::shared_ptr<ops::BatchNormBackends> batch_norm_backends_;
  /// Every convolution of the model reads it (set_convolution_backends).
  std::shared_ptr<ops::ConvolutionBackends> convolution_backends_;
  /// checkpoint_segments > 0: the blocks in checkpoint_sequential's runs (the last one is
  /// not checkpointed).
  std::vector<BlockSegment> checkpoint_segments_;
  /// Every BatchNorm's num_batches_tracked ([] int64 each), advanced together.
  std::vector<torch::Tensor> batch_counters_;
  bool forward_counts_batches_ = true;
  torch::nn::Conv2d conv1{nullptr};
  BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

/// Number of trainable parameter elements (ResNet50, 10 classes: 23,528,522).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace ltrain::models
