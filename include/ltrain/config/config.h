#pragma once
// The run configuration: one plain struct per section, defaults in the declarations.
// One name per setting everywhere: the JSON key `optim.lr` is `--set optim.lr=...` is
// `RunConfig::optim.lr`. Each section lists its keys once, in visit(), each with its one-line
// description and its limits; parsing, printing, saving, --help, the JSON Schema and shell
// completion all walk that list.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ltrain/config/enums.h"

namespace ltrain::config {

// ---- Value constraints, checked while parsing ------------------------------------------------

struct NoLimit {};
/// lo <= value (or lo < value when `exclusive`) and value <= hi.
struct Range {
  double lo;
  double hi;
  bool lo_exclusive = false;
};
inline Range at_least(double lo) { return {lo, 1e300, false}; }
inline Range positive() { return {0.0, 1e300, true}; }
inline Range between(double lo, double hi) { return {lo, hi, false}; }

// Upper limits: what the code holds (an int for a thread count, a float for the LR on the device)
// and what makes sense, so that no value overflows a computation or asks for memory without end.

/// The most images a data set, a training batch or an evaluation batch may hold: 2^22 (12 GiB of
/// uint8 pixels), far past CIFAR-10's 50,000 and the batch-size search's 262,144.
constexpr int64_t kMaxImages = int64_t{1} << 22;
/// The smallest side progressive resizing scales training images to (the imagenet stem's
/// network, stride 32, is down to 1x1 from there on).
constexpr int64_t kMinProgressiveSize = 8;
/// The largest synthetic image side (ImageNet's training crops are 224; fine-tuning goes to 512).
constexpr int64_t kMaxImageSize = 512;
/// The largest model.width: 4 x torchvision's 64 (ResNet-152 then has 16 x its parameters, ~1e9).
constexpr int64_t kMaxWidth = 256;
/// The most output classes (ImageNet-21k has 21,841).
constexpr int64_t kMaxClasses = 100000;
/// The most epochs of a run.
constexpr int64_t kMaxEpochs = 100000;
/// The largest learning rate (optim.lr, schedule.min_lr).
constexpr double kMaxLearningRate = 1000.0;
/// The smallest data.std: a quarter of one step of 8-bit pixels in [0, 1]; dividing by less makes
/// inputs of thousands that no learning rate trains on.
constexpr double kMinStd = 1e-3;

// ---- Sections ----------------------------------------------------------------------------------

struct RunSection {
  /// Name of the run; its directory is out_dir/name (a numeric suffix is added if that exists).
  std::string name = "run";
  /// Folder that holds run directories.
  std::string out_dir = "runs";
  /// Seed of every random choice: initialization, epoch order, augmentation.
  int64_t seed = 0;
  /// auto | cpu | cuda | cuda:N ("auto" picks cuda:0 when the build and a GPU allow it).
  std::string device = "auto";
  /// Training epochs.
  int64_t epochs = 10;
  /// Stop after this many optimizer steps (0: run all epochs).
  int64_t max_steps = 0;
  /// Evaluate on the test set every N epochs and after the last (0: only after the last).
  int64_t eval_every_epochs = 1;
  /// Read the loss and print progress every N steps (one host sync each time).
  int64_t log_every_steps = 50;
  /// Also write the metrics as a TensorBoard event file in the run directory (rank 0).
  bool tensorboard = true;
  /// CPU threads for LibTorch's intra-op parallelism (0: one per CPU core the OS reports); at most
  /// 4 per core of the machine that trains (engine::apply_runtime_settings checks it).
  int64_t threads = 0;
  /// Share of the GPU's memory this process may hold (PyTorch's set_per_process_memory_fraction):
  /// past it, allocations fail as out of memory, as on a card with that much memory; 1: all.
  double gpu_memory_fraction = 1.0;
  /// Early stopping: end the run at an epoch's end once this test metric has not improved for
  /// early_stop_patience evaluations (none: run every epoch).
  BestMetric early_stop_metric = BestMetric::none;
  /// Evaluations without an improvement before the run stops.
  int64_t early_stop_patience = 5;
  /// An improvement is a change past the best value by more than this (accuracy as a fraction).
  double early_stop_min_delta = 0.0;

  template <class V>
  void visit(V& v) {
    v("name", name, "run name; its folder is out_dir/name (-2, -3, ... added when taken)");
    v("out_dir", out_dir, "folder that holds the run folders");
    v("seed", seed, "seed of initialization, epoch order and augmentation", at_least(0));
    v("device", device, "auto, cpu, cuda or cuda:N (auto: cuda:0 where the build and a GPU allow it)");
    v("epochs", epochs, "training epochs", between(1, kMaxEpochs));
    v("max_steps", max_steps, "stop after this many optimizer steps (0: run all epochs)", at_least(0));
    v("eval_every_epochs", eval_every_epochs,
      "evaluate every N epochs and after the last (0: only after the last)", at_least(0));
    v("log_every_steps", log_every_steps,
      "read the loss, log and write metrics every N steps (one host sync each)", at_least(1));
    v("tensorboard", tensorboard, "write TensorBoard event files into the run folder");
    v("threads", threads, "CPU threads of LibTorch (0: one per core; at most 4 per core)", at_least(0));
    v("gpu_memory_fraction", gpu_memory_fraction,
      "share of the GPU's memory this process may hold; past it, out of memory", Range{0, 1, true});
    v("early_stop_metric", early_stop_metric,
      "stop at an epoch's end when this test metric has not improved for early_stop_patience evaluations "
      "(none: never)");
    v("early_stop_patience", early_stop_patience, "evaluations without an improvement before an early stop",
      at_least(1));
    v("early_stop_min_delta", early_stop_min_delta,
      "an improvement beats the best value by more than this (test_acc as a fraction)", at_least(0.0));
  }
};

struct ModelSection {
  /// Network: torchvision's ResNets, wide ResNets and ResNeXts, by torchvision's names.
  Arch arch = Arch::resnet50;
  /// imagenet: 7x7 stride-2 conv + 3x3 max-pool (torchvision); cifar: 3x3 stride-1 conv, no pool.
  Stem stem = Stem::imagenet;
  /// Output classes: at least the data's (checked at start). A config that leaves it out gets the
  /// data's (config/load: 10 for CIFAR-10 and the synthetic source, 100 or 20 for CIFAR-100).
  int64_t num_classes = kCifar10Classes;
  /// Channels of the first stage (torchvision: 64); small values make tiny test models.
  int64_t width = 64;
  /// Start each residual branch's last BatchNorm at zero weight (torchvision's option).
  bool zero_init_residual = false;
  /// Store weights and activations as NHWC (torch.channels_last), model and inputs alike.
  bool channels_last = false;
  /// Activation checkpointing: split the residual blocks into N segments and recompute all but
  /// the last in the backward pass (checkpoint_sequential(chunks=N)); 0 keeps every activation.
  int64_t checkpoint_segments = 0;
  /// BatchNorm's backends in training (ops/batch_norm.h, tried in the order ltrain, cudnn, aten).
  /// ltrain: each BatchNorm with the ReLU and residual add after it on ltrain's own CUDA kernels
  /// where they apply (fp16/bf16 channels_last, power-of-two channels up to 2048): no memset
  /// before each kernel. Not bitwise repeatable, so precision.deterministic turns them off.
  bool ltrain_batch_norm = true;
  /// cudnn: each BatchNorm and the ReLU (and residual add) after it as one cuDNN kernel forward and
  /// one backward where ltrain's do not run (CUDA, fp16/bf16, channels_last); both false: ATen's
  /// three operators.
  bool cudnn_batch_norm = true;
  /// The imagenet stem's max pooling on ltrain's own CUDA kernels where they apply (CUDA,
  /// channels_last; ops/max_pool.h): same values, a smaller arg-max; false: ATen's operator.
  bool ltrain_max_pool = true;
  /// In training, the 1x1 convolutions that a step gains by (ops/fused_conv.h: stride 1, outputs of
  /// 32x32 or more; the bottlenecks' first and last, and the projection shortcuts') on ltrain's
  /// fused kernel, which also sums the output and its square per channel for the BatchNorm after
  /// it, so that BatchNorm reads the output once (CUDA, fp16/bf16, channels_last; a build with
  /// -DLTRAIN_FUSED_CONV=ON on an sm_90 GPU, else one warning line and cuDNN's convolutions).
  bool fused_conv = false;
  /// Start from the weights in this safetensors file (torchvision's names, e.g. `ltrain export`
  /// output or a torchvision state_dict saved from Python); "" starts from a fresh initialization.
  std::string init_from;

  template <class V>
  void visit(V& v) {
    v("arch", arch, "network, by torchvision's name");
    v("stem", stem, "imagenet: 7x7 stride-2 conv and max pooling (torchvision); cifar: 3x3 stride-1 conv");
    v("num_classes", num_classes,
      "output classes, at least the data's (left out: the data's, 100 or 20 with data.source cifar100)",
      between(2, kMaxClasses));
    v("width", width, "channels of the first stage (torchvision: 64)", between(1, kMaxWidth));
    v("zero_init_residual", zero_init_residual, "start each residual branch's last BatchNorm at zero weight");
    v("channels_last", channels_last, "NHWC weights and activations (torch.channels_last)");
    v("checkpoint_segments", checkpoint_segments,
      "activation checkpointing: recompute all but the last of N block segments (0: off)", at_least(0));
    v("ltrain_batch_norm", ltrain_batch_norm,
      "BatchNorm with its ReLU and residual add on ltrain's own CUDA kernels where they apply");
    v("cudnn_batch_norm", cudnn_batch_norm,
      "BatchNorm with its ReLU and residual add as one cuDNN kernel where ltrain's do not run (CUDA, fp16/bf16, NHWC)");
    v("ltrain_max_pool", ltrain_max_pool, "the imagenet stem's max pooling on ltrain's own CUDA kernels (NHWC)");
    v("fused_conv", fused_conv,
      "large 1x1 convolutions on ltrain's kernel that also sums BatchNorm's statistics (sm_90, LTRAIN_FUSED_CONV)");
    v("init_from", init_from, "start from the weights of this safetensors file, torchvision's names ("": fresh)");
  }
};

struct DataSection {
  /// cifar10, cifar100: the binary release's files under `root`; synthetic: random images of
  /// CIFAR-10's shapes.
  DataSource source = DataSource::cifar10;
  /// CIFAR-100's label to train on: fine (100 classes) or coarse (its 20 superclasses).
  Cifar100Labels cifar100_labels = Cifar100Labels::fine;
  /// Folder with the source's files: data_batch_1..5.bin and test_batch.bin (CIFAR-10), train.bin and
  /// test.bin (CIFAR-100). A config that leaves it out gets the source's (config/load:
  /// data/cifar-100-binary for cifar100).
  std::string root = "data/cifar-10-batches-bin";
  /// Training images per micro-batch (an optimizer step takes optim.accumulation_steps of them).
  int64_t batch_size = 256;
  /// Images per evaluation batch.
  int64_t eval_batch_size = 1000;
  /// Visit the training images in a new random order each epoch; false: in file order every
  /// epoch (torch's DataLoader without shuffle=True).
  bool shuffle = true;
  /// Test-time augmentation: evaluation scores each image by the mean of its logits and its
  /// left-right mirror's (two forward passes per batch).
  bool eval_flip_average = false;
  /// Random 32x32 crop of the image padded with zeros by `crop_padding` pixels.
  bool random_crop = true;
  /// Zero padding of the random crop, in pixels per side.
  int64_t crop_padding = 4;
  /// Mirror half of the training images left-right.
  bool horizontal_flip = true;
  /// Cutout (DeVries & Taylor, 2017): set a square of this side to 0 in each normalized training
  /// image (the mean pixel, with `normalize`), centred anywhere in it and clipped at its border;
  /// 0: off.
  int64_t cutout = 0;
  /// Subtract `mean` and divide by `std` per channel (after scaling pixels to [0, 1]).
  bool normalize = true;
  /// Per-channel mean (R, G, B) of pixels in [0, 1]; CIFAR-10's training set by default (a config
  /// with data.source cifar100 that leaves it out gets CIFAR-100's, config/load).
  std::vector<double> mean{0.4914, 0.4822, 0.4465};
  /// Per-channel standard deviation (R, G, B), as `mean`.
  std::vector<double> std{0.2470, 0.2435, 0.2616};
  /// Training images of the synthetic source.
  int64_t synthetic_train_size = 50000;
  /// Test images of the synthetic source.
  int64_t synthetic_test_size = 10000;
  /// Side of the synthetic source's square images, in pixels (CIFAR-10's are 32): 224 measures a
  /// step at ImageNet's size.
  int64_t image_size = 32;
  /// Progressive resizing: the first `progressive_epochs` epochs train on images scaled down,
  /// from this side in the first, growing linearly towards the full side (0: off); later epochs
  /// and evaluation are at the full side. Fewer pixels make early epochs cheaper (fast.ai's
  /// DAWNBench ImageNet runs, FFCV's ResNet recipes).
  int64_t progressive_start_size = 0;
  /// Epochs of progressive resizing; training images have their full side from the next one on
  /// (0: off). A recipe shortened or lengthened by run.epochs alone keeps it as the same share of
  /// the run (config/load).
  int64_t progressive_epochs = 0;
  /// Sides between are rounded down to a multiple of this; each distinct side is one more CUDA
  /// graph capture (and cuDNN autotuning) when the step is graphed.
  int64_t progressive_size_step = 4;

  /// The classes of the labels `source` gives: 10 for CIFAR-10 and the synthetic source, 100 for
  /// CIFAR-100 (20 with cifar100_labels coarse).
  int64_t classes() const {
    if (source != DataSource::cifar100) return kCifar10Classes;
    return cifar100_labels == Cifar100Labels::coarse ? kCifar100CoarseClasses : kCifar100FineClasses;
  }

  template <class V>
  void visit(V& v) {
    v("source", source,
      "cifar10, cifar100: the binary files under root; synthetic: random images of CIFAR-10's shapes");
    v("cifar100_labels", cifar100_labels, "CIFAR-100's label: fine (100 classes) or coarse (20 superclasses)");
    v("root", root,
      "folder with the source's files (data_batch_1..5.bin, test_batch.bin; CIFAR-100: train.bin, test.bin); left "
      "out with cifar100: data/cifar-100-binary");
    v("batch_size", batch_size, "training images per micro-batch (per process)", between(1, kMaxImages));
    v("eval_batch_size", eval_batch_size, "images per evaluation batch", between(1, kMaxImages));
    v("shuffle", shuffle, "a new random order of the training images each epoch (false: file order)");
    v("eval_flip_average", eval_flip_average, "score each test image by the mean logits of it and its mirror image");
    v("random_crop", random_crop, "random crops of the zero-padded training images");
    v("crop_padding", crop_padding, "zero padding of the random crop, pixels per side", between(0, 16));
    v("horizontal_flip", horizontal_flip, "mirror half of the training images left-right");
    v("cutout", cutout, "side of a zeroed square in each training image, in pixels (0: off)", between(0, 32));
    v("normalize", normalize, "subtract mean and divide by std per channel");
    v("mean", mean, "per-channel mean (R, G, B) of pixels in [0, 1] (left out with cifar100: CIFAR-100's)",
      between(0, 1));
    v("std", std, "per-channel standard deviation (R, G, B) (left out with cifar100: CIFAR-100's)",
      at_least(kMinStd));
    v("synthetic_train_size", synthetic_train_size, "training images of the synthetic source", between(1, kMaxImages));
    v("synthetic_test_size", synthetic_test_size, "test images of the synthetic source", between(1, kMaxImages));
    v("image_size", image_size, "side of the synthetic source's square images, in pixels", between(8, kMaxImageSize));
    v("progressive_start_size", progressive_start_size,
      "train the first epochs on images scaled down to this side, growing to full size (0: off)",
      between(0, kMaxImageSize));
    v("progressive_epochs", progressive_epochs,
      "epochs of progressive resizing; full side from the next epoch on (0: off; follows run.epochs set alone)",
      between(0, kMaxEpochs));
    v("progressive_size_step", progressive_size_step,
      "progressive sides are multiples of this (each side is one more graph capture)", between(1, kMaxImageSize));
  }
};

struct OptimSection {
  /// sgd (torch.optim.SGD semantics) or adamw (torch.optim.AdamW).
  OptimizerKind name = OptimizerKind::sgd;
  /// Peak learning rate (the schedule scales it).
  double lr = 0.1;
  /// SGD momentum.
  double momentum = 0.9;
  /// SGD Nesterov momentum.
  bool nesterov = false;
  /// L2 penalty (SGD) or decoupled weight decay (AdamW).
  double weight_decay = 5e-4;
  /// Exempt BatchNorm weights and all biases from weight decay.
  bool no_decay_norm_and_bias = false;
  /// AdamW's beta1, beta2.
  std::vector<double> betas{0.9, 0.999};
  /// AdamW's epsilon.
  double eps = 1e-8;
  /// On CUDA, one fused kernel for the whole step: ltrain's for SGD, LibTorch's for AdamW (LibTorch 2.2+).
  bool fused = true;
  /// Micro-batches per optimizer step; each loss is divided by it (effective batch = K * batch_size).
  int64_t accumulation_steps = 1;
  /// Clip gradients to this global L2 norm before the step (0: no clipping).
  double clip_grad_norm = 0.0;
  /// Exponential moving average of the weights (0: off): after every optimizer step,
  /// average = ema_decay * average + (1 - ema_decay) * weights, over every floating-point
  /// parameter and buffer. Evaluation, `ltrain eval` and `ltrain export` use the average.
  double ema_decay = 0.0;

  template <class V>
  void visit(V& v) {
    v("name", name, "sgd (torch.optim.SGD) or adamw (torch.optim.AdamW)");
    v("lr", lr, "peak learning rate; the schedule scales it", Range{0, kMaxLearningRate, true});
    v("momentum", momentum, "SGD momentum", between(0, 1));
    v("nesterov", nesterov, "SGD with Nesterov momentum");
    v("weight_decay", weight_decay, "L2 penalty (SGD) or decoupled weight decay (AdamW)", between(0, 1));
    v("no_decay_norm_and_bias", no_decay_norm_and_bias, "no weight decay for BatchNorm weights and biases");
    v("betas", betas, "AdamW's beta1 and beta2", Range{0, 1, false});
    v("eps", eps, "AdamW's epsilon", Range{0, 1, true});
    v("fused", fused, "one fused optimizer kernel on CUDA");
    v("accumulation_steps", accumulation_steps,
      "micro-batches per optimizer step (gradient accumulation)", between(1, 1024));
    v("clip_grad_norm", clip_grad_norm, "clip gradients to this global L2 norm (0: off)", between(0, 1e6));
    v("ema_decay", ema_decay,
      "decay of an exponential moving average of the weights, used to evaluate (0: off)", between(0, 0.999999));
  }
};

struct LossSection {
  /// Label smoothing of the cross-entropy loss (torch.nn.CrossEntropyLoss's label_smoothing).
  double label_smoothing = 0.0;
  /// The training step's loss and its gradient on ltrain's two CUDA kernels (ops::cross_entropy)
  /// instead of ATen's dozen small ones.
  bool ltrain_kernels = true;

  template <class V>
  void visit(V& v) {
    v("label_smoothing", label_smoothing, "label smoothing of the cross-entropy loss", Range{0, 1, false});
    v("ltrain_kernels", ltrain_kernels,
      "the training step's loss and its gradient on ltrain's own CUDA kernels (2 launches instead of ATen's ~13)");
  }
};

struct ScheduleSection {
  /// constant | multistep | cosine | onecycle, updated every optimizer step.
  ScheduleKind name = ScheduleKind::cosine;
  /// Linear warm-up length in epochs (fractions allowed) before the schedule proper.
  double warmup_epochs = 0.0;
  /// The warm-up starts at lr * warmup_start_factor.
  double warmup_start_factor = 0.1;
  /// multistep: epochs at which the LR is multiplied by `gamma`.
  std::vector<double> milestones{};
  /// multistep: the factor applied at each milestone (a decay: at most 1).
  double gamma = 0.1;
  /// cosine: the LR reached at the end.
  double min_lr = 0.0;
  /// onecycle: fraction of the steps spent rising to the peak LR.
  double pct_start = 0.3;
  /// onecycle: the start LR is lr / div_factor (at least 1: the LR rises to its peak).
  double div_factor = 25.0;
  /// onecycle: the final LR is the start LR / final_div_factor (at least 1: the LR ends lower).
  double final_div_factor = 1e4;

  template <class V>
  void visit(V& v) {
    v("name", name, "LR schedule, updated every optimizer step");
    v("warmup_epochs", warmup_epochs, "linear warm-up before the schedule, in epochs (fractions allowed)", at_least(0));
    v("warmup_start_factor", warmup_start_factor, "the warm-up starts at lr times this", Range{0, 1, false});
    v("milestones", milestones, "multistep: epochs at which the LR is multiplied by gamma", positive());
    v("gamma", gamma, "multistep: the factor at each milestone", Range{0, 1, true});
    v("min_lr", min_lr, "cosine: the LR at the end", between(0, kMaxLearningRate));
    v("pct_start", pct_start, "onecycle: fraction of the steps spent rising to the peak", Range{0, 1, true});
    v("div_factor", div_factor, "onecycle: the start LR is lr / div_factor", between(1, 1e6));
    v("final_div_factor", final_div_factor,
      "onecycle: the final LR is the start LR / final_div_factor", between(1, 1e9));
  }
};

struct PrecisionSection {
  /// fp32: IEEE float32; tf32: float32 with TF32 tensor-core matmuls and convolutions;
  /// fp16: autocast to float16 with a GradScaler; bf16: autocast to bfloat16, no scaler.
  PrecisionMode mode = PrecisionMode::fp32;
  /// TF32 for the float32 matmuls and convolutions of any mode (on for mode tf32).
  bool tf32 = false;
  /// Let cuDNN time its convolution algorithms on the first steps and keep the fastest.
  bool cudnn_benchmark = false;
  /// With cudnn_benchmark: how many of cuDNN's candidate algorithms are timed per convolution
  /// (0: all of them; PyTorch's torch.backends.cudnn.benchmark_limit, 10 by default there too).
  int64_t cudnn_benchmark_limit = 10;
  /// Only deterministic algorithms (bitwise repeatable runs; slower).
  bool deterministic = false;
  /// fp16: the GradScaler's first scale.
  double loss_scale_init = 65536.0;
  /// fp16: the scale is multiplied by this after loss_scale_growth_interval clean steps.
  double loss_scale_growth_factor = 2.0;
  /// fp16: the scale is multiplied by this after a step with inf/NaN gradients (which is skipped).
  double loss_scale_backoff_factor = 0.5;
  /// fp16: clean steps in a row before the scale grows.
  int64_t loss_scale_growth_interval = 2000;
  /// fp16: stop the run (exit code 4) after more skipped steps in a row than this.
  int64_t max_consecutive_skipped_steps = 50;

  template <class V>
  void visit(V& v) {
    v("mode", mode, "fp32, tf32 (TF32 matmuls and convolutions), fp16 (autocast, GradScaler), bf16 (autocast)");
    v("tf32", tf32, "TF32 for the float32 matmuls and convolutions of any mode");
    v("cudnn_benchmark", cudnn_benchmark, "let cuDNN time its convolution algorithms and keep the fastest");
    v("cudnn_benchmark_limit", cudnn_benchmark_limit,
      "cuDNN algorithms timed per convolution (0: all)", Range{0, 100000, false});
    v("deterministic", deterministic, "only deterministic algorithms: bitwise repeatable runs, slower");
    v("loss_scale_init", loss_scale_init, "fp16: the GradScaler's first scale", Range{0, 16777216, true});
    v("loss_scale_growth_factor", loss_scale_growth_factor,
      "fp16: the scale's factor after loss_scale_growth_interval clean steps", Range{1, 100, true});
    v("loss_scale_backoff_factor", loss_scale_backoff_factor,
      "fp16: the scale's factor after a step with inf/NaN gradients", Range{0, 1, true});
    v("loss_scale_growth_interval", loss_scale_growth_interval,
      "fp16: clean steps in a row before the scale grows", at_least(1));
    v("max_consecutive_skipped_steps", max_consecutive_skipped_steps,
      "fp16: stop the run after more skipped steps in a row than this", at_least(1));
  }
};

struct CheckpointSection {
  /// Write a checkpoint every N epochs and after the last (0: only after the last).
  int64_t every_epochs = 1;
  /// Also write one every N optimizer steps, in the middle of an epoch too (0: off).
  int64_t every_steps = 0;
  /// Checkpoints kept in RUN_DIR/checkpoints (older ones are deleted; best.ltc never is).
  int64_t keep_last = 3;
  /// Keep RUN_DIR/checkpoints/best.ltc: the state after the evaluation with the best value of
  /// this metric (none | test_acc | test_loss).
  BestMetric best_metric = BestMetric::none;
  /// none: a new run directory; auto: continue from the newest valid checkpoint in
  /// run.out_dir/run.name (a fresh start there if it has none); or the path of a checkpoint file.
  std::string resume = "none";

  template <class V>
  void visit(V& v) {
    v("every_epochs", every_epochs,
      "write a checkpoint every N epochs and after the last (0: only after the last)", at_least(0));
    v("every_steps", every_steps, "also write one every N optimizer steps (0: off)", at_least(0));
    v("keep_last", keep_last, "checkpoints kept; older ones are deleted (best.ltc never)", at_least(1));
    v("best_metric", best_metric, "keep best.ltc, the checkpoint with the best value of this metric");
    v("resume", resume, "none, auto (the newest valid checkpoint in out_dir/name) or a checkpoint file");
  }
};

struct CudaGraphSection {
  /// Capture the whole training step (forward, loss, backward, GradScaler, optimizer; every
  /// micro-batch) as one CUDA graph after `warmup_steps` eager steps, and replay it (CUDA only).
  bool train = false;
  /// Capture evaluation's forward pass too (full batches; a last partial batch runs eagerly).
  bool eval = false;
  /// Eager training steps before the capture, on a side stream: cuDNN autotuning and lazy set-up
  /// happen there. They train like any other step.
  int64_t warmup_steps = 3;
  /// With `train`: each convolution's weight gradient on a second stream, forked and joined
  /// inside the captured step, so that the graph runs it beside the data gradient and the rest
  /// of the backward pass; where the first stage's maps are smallest, the rest of the step is
  /// captured at a higher stream priority than the branch. The same kernels on the same inputs:
  /// the same numbers. "auto": for the batch shapes where it was measured faster, those whose
  /// first-stage feature maps are small (engine::TrainStep::branches_pay).
  StepBranches branches = StepBranches::automatic;
  /// With the branch: each convolution weight's SGD update on the branch as soon as its gradient
  /// is complete and the backward pass has read the weight for the last time, beside the rest of
  /// the backward pass, instead of all at the step's end. The same update of the same numbers.
  /// Where nothing reads the gradients between the backward pass and the update: ltrain's SGD
  /// kernel (optim.fused), no GradScaler (bf16, fp32), one micro-batch, no clipping, one process;
  /// elsewhere every update stays at the step's end.
  bool updates_in_backward = false;
  /// ltrain's BatchNorm kernels launched as programmatic dependents of the kernel before them, on
  /// GPUs of sm_90 and later (ops/batch_norm.h): each may be placed while that kernel ends, hiding
  /// part of the gap between the two. The same numbers. "auto": the launches that reduce within a
  /// thread-block cluster (tensors of a few thousand rows, whose few blocks find SMs free), "on":
  /// every launch. Applies to eager steps and evaluation too.
  DependentLaunch dependent_launch = DependentLaunch::off;
  /// The captured step's and evaluation's images kept with zero channels past their 3 where
  /// cuDNN's first convolution runs faster on 4 (fp16) or 8 (bf16) channels in channels_last
  /// (ops::padded_image_channels); the stem's weight is extended with zero channels to match each
  /// pass. The same convolution in exact arithmetic; cuDNN's kernels for it round differently.
  bool padded_images = true;

  template <class V>
  void visit(V& v) {
    v("train", train, "capture the whole training step as one CUDA graph and replay it");
    v("eval", eval, "capture evaluation's forward pass as a CUDA graph");
    v("warmup_steps", warmup_steps, "eager training steps before the capture", at_least(1));
    v("branches", branches,
      "with train: each convolution's weight gradient on a second stream, beside the rest of the backward pass "
      "(auto: where the first stage's feature maps are small)");
    v("updates_in_backward", updates_in_backward,
      "with branches: each convolution weight's SGD update inside the backward pass, as soon as its gradient is "
      "complete (bf16/fp32, ltrain's SGD kernel, one micro-batch, no clipping, one process)");
    v("dependent_launch", dependent_launch,
      "ltrain's BatchNorm kernels as programmatic dependents of the kernel before them, sm_90 and later "
      "(auto: those of small tensors, which reduce within a thread-block cluster)");
    v("padded_images", padded_images,
      "the captured step's and evaluation's images with zero channels up to 4 (fp16) or 8 (bf16) in channels_last, "
      "on which cuDNN's stem convolution runs faster");
  }
};

/// Data-parallel training over several processes (launched by torchrun or `ltrain launch`,
/// which set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). data.batch_size is per
/// process; a step takes WORLD_SIZE times as many images. Ignored in a single process.
struct DistributedSection {
  /// The c10d backend: "auto" is NCCL on CUDA devices and Gloo on the CPU.
  DistBackend backend = DistBackend::automatic;
  /// How long a rank waits for the others (rendezvous, a collective) before it stops with an
  /// error naming the rank that did not answer, instead of hanging.
  double timeout_s = 300.0;
  /// BatchNorm statistics over the whole global batch (torch.nn.SyncBatchNorm) instead of each
  /// process's own part of it.
  bool sync_batch_norm = false;
  /// Gradients are averaged in buckets of about this size, each sent as soon as the backward
  /// pass has produced all of its gradients.
  double bucket_mb = 25.0;
  /// The type gradients travel in: fp32 (exact averaging), or bf16/fp16, half the bytes, the
  /// gradients rounded before they are averaged (PyTorch's bf16/fp16 compression hooks). The
  /// averaged gradients are float32 again for the optimizer.
  GradientDtype gradient_dtype = GradientDtype::fp32;

  template <class V>
  void visit(V& v) {
    v("backend", backend, "c10d backend (auto: NCCL on CUDA, Gloo on the CPU)");
    v("timeout_s", timeout_s,
      "seconds a process waits for the others before it stops (exit code 5)", Range{0, 86400, true});
    v("sync_batch_norm", sync_batch_norm, "BatchNorm statistics over the global batch (SyncBatchNorm)");
    v("bucket_mb", bucket_mb,
      "size of the gradient buckets averaged while the backward pass runs, in MB", Range{0, 16384, true});
    v("gradient_dtype", gradient_dtype, "type the gradients travel in: fp32, or bf16/fp16 (half the bytes)");
  }
};

/// Everything a run needs, resolved from JSON files, `extends` and --set overrides.
struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  OptimSection optim;
  LossSection loss;
  ScheduleSection schedule;
  PrecisionSection precision;
  CheckpointSection checkpoint;
  CudaGraphSection cuda_graph;
  DistributedSection distributed;

  template <class V>
  void visit_sections(V& v) {
    v.section("run", run, "the run's name and folder, length, seed, device and logging");
    v.section("model", model, "the network: ResNet depth, stem, width, layout and kernels");
    v.section("data", data, "the data set, batches and augmentation");
    v.section("optim", optim, "the optimizer");
    v.section("loss", loss, "the cross-entropy loss");
    v.section("schedule", schedule, "the learning-rate schedule");
    v.section("precision", precision, "number formats, cuDNN's switches and the GradScaler");
    v.section("checkpoint", checkpoint, "checkpoints: how often, how many, the best one, resuming");
    v.section("cuda_graph", cuda_graph, "CUDA graph capture of training and evaluation");
    v.section("distributed", distributed, "data-parallel training over several processes");
  }
};

}  // namespace ltrain::config
