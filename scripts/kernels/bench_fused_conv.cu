// ltrain's convolution with BatchNorm statistics (kernels/fused_conv.h) against cuDNN's plain
// convolution, for every distinct forward convolution of ResNet-50:
// 1. numerics: every configuration on every layer's shape at batch 2 against float64 on the CPU
//    (y, and its per-channel sum and sum of squares), y poisoned with NaN beforehand;
// 2. at the benchmark's batch, the automatic configuration's y against cuDNN's and its sums
//    against float64 sums of cuDNN's y;
// 3. times: cuDNN's plain forward (the fastest of its heuristics' first candidates, as the cuDNN
//    graphs study, experiments/conv_graph/, builds them) and the fused kernels (each configuration), each as 20 runs
//    captured in a CUDA graph, the median over 15 replays after 2 to warm up;
// 4. the BatchNorm + ReLU after each convolution (ltrain's, kernels/batch_norm.h), timed the same
//    way: batch_norm_forward on cuDNN's y, which reads y for its statistics, against
//    batch_norm_forward_given_statistics on the fused y and its sums, which reads y once. The pairs
//    (convolution + BatchNorm) decide whether the fused path pays in a training step. On the fused
//    y, the two BatchNorms are checked against each other.
// Summed over the network (each layer times its count). On a GPU host, from the repository:
//   bash scripts/kernels/bench-fused-conv.sh [--dtype bf16|fp16] [--batch 512] [--stem cifar|imagenet] [--size 32]
//                                            [--candidates 3]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cudnn.h>

#include "ltrain/kernels/batch_norm.h"
#include "../../experiments/conv_graph/conv_graph.h"
#include "ltrain/kernels/fused_conv.h"
#include "bench_support.h"
#include "resnet50_layers.h"

using namespace ltrain::kernels;

namespace {

/// A device buffer of fp16/bf16 values drawn uniformly from [low, high), and their host copy
/// (already rounded to the element type).
struct Values {
  std::vector<float> host;
  void* device = nullptr;
  Values(size_t n, std::mt19937& rng, float low, float high) : host(n) {
    std::uniform_real_distribution<float> d(low, high);
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = from_float(d(rng));
      host[i] = to_float(bits[i]);
    }
    CHECK_CUDA(cudaMalloc(&device, n * 2 + 16));
    CHECK_CUDA(cudaMemcpy(device, bits.data(), n * 2, cudaMemcpyHostToDevice));
  }
  Values(const Values&) = delete;
  ~Values() { cudaFree(device); }
};

struct DeviceBuffer {
  void* device = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { CHECK_CUDA(cudaMalloc(&device, n + 16)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(device); }
  void poison() { CHECK_CUDA(cudaMemset(device, 0xff, bytes)); }  // NaN in fp16, bf16 and float32
  void fill_floats(float value) {
    const std::vector<float> values(bytes / 4, value);
    CHECK_CUDA(cudaMemcpy(device, values.data(), values.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<float> read_elements(size_t n) const {
    std::vector<uint16_t> bits(n);
    CHECK_CUDA(cudaMemcpy(bits.data(), device, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = to_float(bits[i]);
    return out;
  }
  std::vector<float> read_floats(size_t n) const {
    std::vector<float> out(n);
    CHECK_CUDA(cudaMemcpy(out.data(), device, n * 4, cudaMemcpyDeviceToHost));
    return out;
  }
};

/// Per-channel sums of [rows, channels] values in float64: sum, sum of squares, sum of magnitudes.
struct ChannelSums {
  std::vector<double> sum, square, magnitude;
};
template <class T>
ChannelSums channel_sums(const std::vector<T>& y, int64_t channels) {
  ChannelSums s{std::vector<double>(channels), std::vector<double>(channels), std::vector<double>(channels)};
  for (size_t i = 0; i < y.size(); ++i) {
    const size_t c = i % static_cast<size_t>(channels);
    const double v = y[i];
    s.sum[c] += v;
    s.square[c] += v * v;
    s.magnitude[c] += std::fabs(v);
  }
  return s;
}

/// The errors of a result against its reference: y as ||got - want|| / ||want||; the sums as the
/// largest |got - want| over the channel's sum of magnitudes (which sets what rounding costs), the
/// sums of squares as the largest relative error. NaN (an unwritten element) makes them NaN.
struct Errors {
  double y = 0, sum = 0, square = 0;
  bool within(double tolerance_y, double tolerance_sums) const {
    return y < tolerance_y && sum < tolerance_sums && square < tolerance_sums;  // false for NaN
  }
};
template <class T>
Errors errors_of(const std::vector<float>& y, const std::vector<T>& want_y, const std::vector<float>& sum,
                 const std::vector<float>& square, const ChannelSums& want) {
  Errors e;
  double difference = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = y[i] - static_cast<double>(want_y[i]);
    difference += d * d;
    norm += static_cast<double>(want_y[i]) * want_y[i];
  }
  e.y = std::sqrt(difference / std::max(norm, 1e-30));
  if (std::isnan(difference)) e.y = NAN;
  for (size_t c = 0; c < sum.size(); ++c) {
    const double es = std::fabs(sum[c] - want.sum[c]) / std::max(want.magnitude[c], 1e-30);
    const double eq = std::fabs(square[c] - want.square[c]) / std::max(want.square[c], 1e-30);
    e.sum = std::isnan(es) || std::isnan(e.sum) ? NAN : std::max(e.sum, es);
    e.square = std::isnan(eq) || std::isnan(e.square) ? NAN : std::max(e.square, eq);
  }
  return e;
}

/// The fused kernel's outputs for one shape and configuration.
struct FusedRun {
  DeviceBuffer y, sum, square, workspace;
  FusedRun(const ConvShape& s, FusedConvConfig config)
      : y(static_cast<size_t>(s.batch * s.out_height() * s.out_width() * s.out_channels) * 2),
        sum(static_cast<size_t>(s.out_channels) * 4),
        square(static_cast<size_t>(s.out_channels) * 4),
        workspace(fused_conv_workspace_bytes(g_type, s, config)) {}
  FusedConvForward arguments(const void* x, const void* w) {
    FusedConvForward a;
    a.x = x;
    a.weight = w;
    a.y = y.device;
    a.sum = static_cast<float*>(sum.device);
    a.square_sum = static_cast<float*>(square.device);
    a.workspace = workspace.device;
    a.workspace_bytes = workspace.bytes;
    return a;
  }
};

/// ltrain's BatchNorm + ReLU on a convolution's y viewed as [rows, channels]: a fresh
/// torch.nn.BatchNorm2d's parameters (weight 1, bias 0, running mean 0, running variance 1; float32
/// [channels]), the saved statistics it writes (float32 [channels]) and its own y (fp16/bf16
/// [rows, channels]).
struct BatchNormRun {
  DeviceBuffer weight, bias, running_mean, running_var, saved_mean, saved_inv_std, y;
  explicit BatchNormRun(const BatchNormShape& shape)
      : weight(static_cast<size_t>(shape.channels) * 4),
        bias(static_cast<size_t>(shape.channels) * 4),
        running_mean(static_cast<size_t>(shape.channels) * 4),
        running_var(static_cast<size_t>(shape.channels) * 4),
        saved_mean(static_cast<size_t>(shape.channels) * 4),
        saved_inv_std(static_cast<size_t>(shape.channels) * 4),
        y(static_cast<size_t>(shape.rows * shape.channels) * 2) {
    weight.fill_floats(1);
    bias.fill_floats(0);
    running_mean.fill_floats(0);
    running_var.fill_floats(1);
  }
  /// sum and square_sum (float32 [channels]) for batch_norm_forward_given_statistics only.
  BatchNormForward arguments(const void* x, const float* sum = nullptr, const float* square_sum = nullptr) {
    BatchNormForward a;
    a.x = x;
    a.y = y.device;
    a.weight = static_cast<const float*>(weight.device);
    a.bias = static_cast<const float*>(bias.device);
    a.running_mean = static_cast<float*>(running_mean.device);
    a.running_var = static_cast<float*>(running_var.device);
    a.saved_mean = static_cast<float*>(saved_mean.device);
    a.saved_inv_std = static_cast<float*>(saved_inv_std.device);
    a.momentum = 0.1;
    a.eps = 1e-5;
    a.sum = sum;
    a.square_sum = square_sum;
    return a;
  }
  void poison_outputs() {
    y.poison();
    saved_mean.poison();
    saved_inv_std.poison();
  }
};

/// The larger of two errors, NaN if either is (an unwritten element).
double worse(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

/// How far one BatchNorm's outputs are from another's on the same x: y as the largest |difference|
/// over the largest |y|; the saved mean as the largest |difference| times 1 / std (how far it moves
/// the normalized y: a mean near zero has no useful relative error); the saved 1 / std as the
/// largest relative difference.
struct BatchNormErrors {
  double y = 0, mean = 0, inv_std = 0;
};
BatchNormErrors batch_norm_errors(const BatchNormRun& got, const BatchNormRun& want, const BatchNormShape& shape) {
  const size_t n = static_cast<size_t>(shape.rows * shape.channels), channels = static_cast<size_t>(shape.channels);
  const std::vector<float> got_y = got.y.read_elements(n), want_y = want.y.read_elements(n);
  double difference = 0, largest = 0;
  for (size_t i = 0; i < n; ++i) {
    difference = worse(difference, std::fabs(static_cast<double>(got_y[i]) - want_y[i]));
    largest = worse(largest, std::fabs(static_cast<double>(want_y[i])));
  }
  BatchNormErrors e;
  e.y = difference / std::max(largest, 1e-30);
  const std::vector<float> got_mean = got.saved_mean.read_floats(channels), want_mean = want.saved_mean.read_floats(channels);
  const std::vector<float> got_inv_std = got.saved_inv_std.read_floats(channels),
                           want_inv_std = want.saved_inv_std.read_floats(channels);
  for (size_t c = 0; c < channels; ++c) {
    e.mean = worse(e.mean, std::fabs(static_cast<double>(got_mean[c]) - want_mean[c]) * want_inv_std[c]);
    e.inv_std = worse(e.inv_std, std::fabs(static_cast<double>(got_inv_std[c]) - want_inv_std[c]) /
                                     std::max(std::fabs(static_cast<double>(want_inv_std[c])), 1e-30));
  }
  return e;
}

const char* reduction_name(BatchNormReduction reduction) {
  switch (reduction) {
    case BatchNormReduction::cluster: return "cluster";
    case BatchNormReduction::grid: return "grid";
    case BatchNormReduction::streaming: return "streaming";
    default: return "none";
  }
}

/// "12.3", or `missing` for a time that was not taken (negative).
std::string time_text(double us, const char* missing) {
  if (us < 0) return missing;
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", us);
  return text;
}

/// y = conv(x, w) in float64 on the CPU: NHWC x, KRSC w.
std::vector<double> reference_conv(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w) {
  const int64_t P = s.out_height(), Q = s.out_width(), C = s.in_channels, K = s.out_channels, R = s.kernel;
  std::vector<double> y(static_cast<size_t>(s.batch * P * Q * K), 0.0);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t k = 0; k < K; ++k) {
          double acc = 0;
          for (int64_t r = 0; r < R; ++r)
            for (int64_t t = 0; t < R; ++t) {
              const int64_t h = p * s.stride - s.padding + r, ww = q * s.stride - s.padding + t;
              if (h < 0 || h >= s.height || ww < 0 || ww >= s.width) continue;
              const float* xp = &x[static_cast<size_t>(((n * s.height + h) * s.width + ww) * C)];
              const float* wp = &w[static_cast<size_t>(((k * R + r) * R + t) * C)];
              for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(xp[c]) * wp[c];
            }
          y[static_cast<size_t>(((n * P + p) * Q + q) * K + k)] = acc;
        }
  return y;
}

const double kToleranceY = 1e-2;      // bf16 rounding of y: about 2^-9 relative per element
const double kToleranceSums = 1e-3;   // sums of float32 accumulators against float64
// The two BatchNorms on one y: bf16 rounding of their y, statistics from float32 sums of the
// unrounded convolution against sums of its rounded y.
const double kToleranceBatchNorm = 5e-2;

/// Every configuration on `s` at batch 2 against float64 on the CPU; prints a line per configuration.
bool check_small(const ConvShape& full, std::mt19937& rng) {
  ConvShape s = full;
  s.batch = 2;
  const size_t x_n = static_cast<size_t>(s.batch * s.height * s.width * s.in_channels);
  const size_t w_n = static_cast<size_t>(s.out_channels * s.kernel * s.kernel * s.in_channels);
  const size_t y_n = static_cast<size_t>(s.batch * s.out_height() * s.out_width() * s.out_channels);
  Values x(x_n, rng, -0.5f, 1.5f), w(w_n, rng, -0.1f, 0.1f);
  const std::vector<double> want_y = reference_conv(s, x.host, w.host);
  const ChannelSums want = channel_sums(want_y, s.out_channels);
  bool ok = true;
  for (int c = 0; c < static_cast<int>(FusedConvConfig::count); ++c) {
    const FusedConvConfig config = static_cast<FusedConvConfig>(c);
    FusedRun run(s, config);
    run.y.poison();
    run.sum.poison();
    run.square.poison();
    const cudaError_t e = fused_conv_forward(g_type, s, run.arguments(x.device, w.device), nullptr, config);
    if (e != cudaSuccess) {
      std::printf("    batch 2, %-22s refused: %s\n", fused_conv_config_name(config), cudaGetErrorString(e));
      cudaGetLastError();
      continue;  // timed as unavailable below, not a wrong result
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    const Errors err = errors_of(run.y.read_elements(y_n), want_y, run.sum.read_floats(s.out_channels),
                                 run.square.read_floats(s.out_channels), want);
    const bool pass = err.within(kToleranceY, kToleranceSums);
    ok = ok && pass;
    std::printf("    batch 2, %-22s %s: y %.1e, sum %.1e, sum of squares %.1e\n", fused_conv_config_name(config),
                pass ? "ok" : "WRONG", err.y, err.sum, err.square);
  }
  return ok;
}

/// Microseconds per call of `enqueue` (20 calls captured in one CUDA graph; the median of 15
/// replays after 2 to warm up); -1 where it cannot be captured or fails.
double time_graph(cudaStream_t stream, const std::function<bool()>& enqueue) {
  const int calls = 20, warm = 2, replays = 15;
  if (!enqueue()) return -1;
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bool captured = true;
  for (int i = 0; i < calls; ++i) captured = captured && enqueue();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  if (!captured || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    return -1;
  }
  for (int i = 0; i < warm; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms(replays);
  for (int i = 0; i < replays; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms[replays / 2] * 1000.0 / calls;
}

}  // namespace

int main(int argc, char** argv) {
  g_type = ElementType::bfloat16;
  int64_t batch = 512;
  bool imagenet_stem = false;
  int64_t image_size = 32;  // the images' side
  int candidates = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dtype") g_type = value == "fp16" ? ElementType::float16 : ElementType::bfloat16;
    else if (flag == "--batch") batch = std::atoll(value.c_str());
    else if (flag == "--stem") imagenet_stem = value == "imagenet";
    else if (flag == "--candidates") candidates = std::atoi(value.c_str());
    else if (flag == "--size") image_size = std::atoll(value.c_str());
  }
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp properties;
  CHECK_CUDA(cudaGetDeviceProperties(&properties, device));
  std::printf("%s, cuDNN %zu, %s, ResNet-50 %s stem, %lldx%lld images, batch %lld\n", properties.name,
              cudnnGetVersion(), g_type == ElementType::float16 ? "fp16" : "bf16",
              imagenet_stem ? "imagenet" : "cifar", static_cast<long long>(image_size),
              static_cast<long long>(image_size), static_cast<long long>(batch));
  if (!fused_conv_device_supported(device)) {
    std::printf("the fused kernels need an sm_90 GPU; this one is sm_%d%d\n", properties.major, properties.minor);
    return 3;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const std::vector<Layer> layers = resnet50_layers(batch, image_size, imagenet_stem);
  std::mt19937 rng(1);
  bool numerics_ok = true;
  bool batch_norm_ok = true;

  struct Row {
    std::string name;
    int count;
    double cudnn, fused, per_config[static_cast<int>(FusedConvConfig::count)];
    FusedConvConfig config;
    std::string engine;
    bool pointwise = false;  // 1x1 kernel, stride 1
    // The BatchNorm + ReLU after the convolution, us; -1 where not taken.
    double bn_forward = -1, bn_given = -1;
    double pair_cudnn() const { return cudnn >= 0 && bn_forward >= 0 ? cudnn + bn_forward : -1; }
    double pair_fused() const { return fused >= 0 && bn_given >= 0 ? fused + bn_given : -1; }
  };
  std::vector<Row> rows;
  for (const Layer& layer : layers) {
    const ConvShape& s = layer.shape;
    char name[96];
    std::snprintf(name, sizeof(name), "%lld->%lld, %lld/%lld, %lld", static_cast<long long>(s.in_channels),
                  static_cast<long long>(s.out_channels), static_cast<long long>(s.kernel),
                  static_cast<long long>(s.stride), static_cast<long long>(s.height));
    std::printf("%s (x%d):\n", name, layer.count);
    const char* why = nullptr;
    if (!fused_conv_supported(g_type, s, &why)) {
      std::printf("    not supported: %s\n", why);
      continue;
    }
    numerics_ok = check_small(s, rng) && numerics_ok;

    const size_t x_n = static_cast<size_t>(s.batch * s.height * s.width * s.in_channels);
    const size_t w_n = static_cast<size_t>(s.out_channels * s.kernel * s.kernel * s.in_channels);
    const size_t y_n = static_cast<size_t>(s.batch * s.out_height() * s.out_width() * s.out_channels);
    Values x(x_n, rng, -0.5f, 1.5f), w(w_n, rng, -0.05f, 0.05f);
    DeviceBuffer y_cudnn(y_n * 2);
    Row row{name, layer.count, -1, -1, {}, fused_conv_config(g_type, s), ""};

    // cuDNN's plain forward: the fastest candidate.
    std::string why_not;
    auto plans = ConvGraph::candidates(g_type, ConvPass::forward, s, {false, false}, candidates, &why_not);
    ConvBuffers buffers;
    buffers.x = x.device;
    buffers.weight = w.device;
    buffers.y = y_cudnn.device;
    for (auto& plan : plans) {
      DeviceBuffer workspace(static_cast<size_t>(plan->workspace_bytes()));
      const double us = time_graph(stream, [&] { return plan->run(buffers, workspace.device, stream).empty(); });
      if (us >= 0 && (row.cudnn < 0 || us < row.cudnn)) {
        row.cudnn = us;
        row.engine = plan->engine();
      }
    }
    if (plans.empty()) std::printf("    cuDNN: %s\n", why_not.c_str());

    // The fused kernels: each configuration timed, the automatic one checked against cuDNN's y.
    for (int c = 0; c < static_cast<int>(FusedConvConfig::count); ++c) {
      const FusedConvConfig config = static_cast<FusedConvConfig>(c);
      FusedRun run(s, config);
      FusedConvForward arguments = run.arguments(x.device, w.device);
      if (config == row.config && row.cudnn >= 0) {
        run.y.poison();
        run.sum.poison();
        run.square.poison();
        const cudaError_t e = fused_conv_forward(g_type, s, arguments, stream, config);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        if (e != cudaSuccess) {
          std::printf("    batch %lld, %-20s refused: %s\n", static_cast<long long>(s.batch),
                      fused_conv_config_name(config), cudaGetErrorString(e));
          cudaGetLastError();
          row.per_config[c] = -1;
          continue;
        }
        const std::vector<float> want_y = y_cudnn.read_elements(y_n);
        const Errors err = errors_of(run.y.read_elements(y_n), want_y, run.sum.read_floats(s.out_channels),
                                     run.square.read_floats(s.out_channels), channel_sums(want_y, s.out_channels));
        const bool pass = err.within(kToleranceY, kToleranceSums);
        numerics_ok = numerics_ok && pass;
        std::printf("    batch %lld, %-20s %s against cuDNN's y: y %.1e, sum %.1e, sum of squares %.1e\n",
                    static_cast<long long>(s.batch), fused_conv_config_name(config), pass ? "ok" : "WRONG", err.y,
                    err.sum, err.square);
      }
      row.per_config[c] = time_graph(stream, [&] {
        return fused_conv_forward(g_type, s, arguments, stream, config) == cudaSuccess;
      });
    }
    row.fused = row.per_config[static_cast<int>(row.config)];
    std::printf("    cuDNN %.1f us (%s); fused %.1f us (%s)\n", row.cudnn, row.engine.c_str(), row.fused,
                fused_conv_config_name(row.config));
    row.pointwise = s.kernel == 1 && s.stride == 1;

    // The BatchNorm + ReLU after it: x is the convolution's y, [batch * out_h * out_w, out_channels].
    const BatchNormShape bn_shape{s.batch * s.out_height() * s.out_width(), s.out_channels};
    const BatchNormActivation relu = BatchNormActivation::relu;
    // Outside any capture: the grid reductions' accumulators are made on first use.
    const bool forward_supported = batch_norm_supported(g_type, relu, bn_shape, stream);
    const bool given_supported = batch_norm_given_statistics_supported(g_type, bn_shape);
    if (forward_supported || given_supported) {
      // The automatic configuration's y and sums, for the given-statistics BatchNorm to read.
      FusedRun fused(s, row.config);
      bool fused_ran = false;
      if (row.fused >= 0) {
        fused_ran = fused_conv_forward(g_type, s, fused.arguments(x.device, w.device), stream,
                                       row.config) == cudaSuccess;
        if (!fused_ran) cudaGetLastError();
        CHECK_CUDA(cudaStreamSynchronize(stream));
      }
      const float* fused_sum = static_cast<const float*>(fused.sum.device);
      const float* fused_square = static_cast<const float*>(fused.square.device);
      BatchNormRun given(bn_shape), computed(bn_shape);
      if (fused_ran && forward_supported && given_supported) {
        // Both BatchNorms on the fused y: statistics from its sums against statistics from y itself.
        given.poison_outputs();
        computed.poison_outputs();
        const cudaError_t given_error = batch_norm_forward_given_statistics(
            g_type, relu, bn_shape, given.arguments(fused.y.device, fused_sum, fused_square), stream);
        const cudaError_t computed_error =
            batch_norm_forward(g_type, relu, bn_shape, computed.arguments(fused.y.device), stream);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        if (given_error != cudaSuccess || computed_error != cudaSuccess) {
          std::printf("    BatchNorm FAILED: given statistics %s, forward %s\n", cudaGetErrorString(given_error),
                      cudaGetErrorString(computed_error));
          cudaGetLastError();
          batch_norm_ok = false;
        } else {
          const BatchNormErrors err = batch_norm_errors(given, computed, bn_shape);
          const bool pass = err.y <= kToleranceBatchNorm;  // false for NaN
          batch_norm_ok = batch_norm_ok && pass;
          std::printf("    BatchNorm given statistics %s against batch_norm_forward on the fused y: y %.1e, "
                      "saved mean %.1e (times 1/std), saved 1/std %.1e\n",
                      pass ? "ok" : "FAILED", err.y, err.mean, err.inv_std);
        }
      }
      if (forward_supported && row.cudnn >= 0) {
        const BatchNormForward arguments = computed.arguments(y_cudnn.device);
        row.bn_forward = time_graph(stream, [&] {
          return batch_norm_forward(g_type, relu, bn_shape, arguments, stream) == cudaSuccess;
        });
      }
      if (given_supported && fused_ran) {
        const BatchNormForward arguments = given.arguments(fused.y.device, fused_sum, fused_square);
        row.bn_given = time_graph(stream, [&] {
          return batch_norm_forward_given_statistics(g_type, relu, bn_shape, arguments, stream) == cudaSuccess;
        });
      }
    }
    const double pair_cudnn = row.pair_cudnn(), pair_fused = row.pair_fused();
    char pair_ratio[32] = "n/a";
    if (pair_cudnn >= 0 && pair_fused >= 0) std::snprintf(pair_ratio, sizeof(pair_ratio), "%.2fx", pair_fused / pair_cudnn);
    std::printf("    BatchNorm forward %s us (%s reduction), given statistics %s us; cuDNN + BatchNorm %s us, "
                "fused + BatchNorm given %s us (%s)\n",
                time_text(row.bn_forward, "n/a").c_str(),
                reduction_name(batch_norm_reduction(g_type, relu, bn_shape)), time_text(row.bn_given, "n/a").c_str(),
                time_text(pair_cudnn, "n/a").c_str(), time_text(pair_fused, "n/a").c_str(), pair_ratio);
    rows.push_back(row);
  }

  std::printf("\nResNet-50 forward convolutions, %s stem, %s, batch %lld, us a run:\n",
              imagenet_stem ? "imagenet" : "cifar", g_type == ElementType::float16 ? "fp16" : "bf16",
              static_cast<long long>(batch));
  std::printf("| conv (C->K, k/s, side) | n | cuDNN | fused + stats | fused / cuDNN |");
  for (int c = 0; c < static_cast<int>(FusedConvConfig::count); ++c)
    std::printf(" %s |", fused_conv_config_name(static_cast<FusedConvConfig>(c)));
  std::printf(" BN forward | BN given statistics | cuDNN + BN | fused + BN given | pair fused / cuDNN |");
  std::printf("\n|---|---|---|---|---|");
  for (int c = 0; c < static_cast<int>(FusedConvConfig::count); ++c) std::printf("---|");
  std::printf("---|---|---|---|---|");
  std::printf("\n");
  double total_cudnn = 0, total_fused = 0, total_best = 0;
  for (const Row& r : rows) {
    std::printf("| %s | %d | %.1f | %.1f | %.2f |", r.name.c_str(), r.count, r.cudnn, r.fused, r.fused / r.cudnn);
    double best = -1;
    for (int c = 0; c < static_cast<int>(FusedConvConfig::count); ++c) {
      std::printf(" %s |", time_text(r.per_config[c], "").c_str());  // blank: the configuration refused it
      if (r.per_config[c] >= 0 && (best < 0 || r.per_config[c] < best)) best = r.per_config[c];
    }
    // Blank where not taken.
    const double pair_cudnn = r.pair_cudnn(), pair_fused = r.pair_fused();
    std::printf(" %s | %s | %s | %s |", time_text(r.bn_forward, "").c_str(), time_text(r.bn_given, "").c_str(),
                time_text(pair_cudnn, "").c_str(), time_text(pair_fused, "").c_str());
    if (pair_cudnn >= 0 && pair_fused >= 0) std::printf(" %.2f |", pair_fused / pair_cudnn);
    else std::printf("  |");
    std::printf("\n");
    total_cudnn += r.count * r.cudnn;
    total_fused += r.count * r.fused;
    total_best += r.count * best;
  }
  std::printf("\nsum over the network (%zu distinct layers), us: cuDNN %.0f, fused + stats %.0f (%.2fx), "
              "fastest configuration per layer %.0f (%.2fx)\n",
              rows.size(), total_cudnn, total_fused, total_fused / total_cudnn, total_best, total_best / total_cudnn);
  // The pairs over the layers where both were timed, each layer times its count; "where it pays"
  // takes the fused pair on the layers where it is faster and cuDNN's pair elsewhere.
  double pairs_cudnn = 0, pairs_fused = 0, pointwise_cudnn = 0, pointwise_fused = 0, paying_cudnn = 0,
         paying_fused = 0;
  size_t paired = 0, paying = 0;
  for (const Row& r : rows) {
    const double pair_cudnn = r.pair_cudnn(), pair_fused = r.pair_fused();
    if (pair_cudnn < 0 || pair_fused < 0) continue;
    ++paired;
    pairs_cudnn += r.count * pair_cudnn;
    pairs_fused += r.count * pair_fused;
    if (r.pointwise) {
      pointwise_cudnn += r.count * pair_cudnn;
      pointwise_fused += r.count * pair_fused;
    }
    if (pair_fused < pair_cudnn) {
      ++paying;
      paying_cudnn += r.count * pair_cudnn;
      paying_fused += r.count * pair_fused;
    }
  }
  const double where_it_pays = pairs_cudnn - paying_cudnn + paying_fused;
  std::printf("convolution + BatchNorm pairs summed over the network (%zu of %zu layers), us: cuDNN + BatchNorm "
              "%.0f, fused + BatchNorm given %.0f (%.2fx); 1x1 stride-1 layers %.0f against %.0f (%.2fx); "
              "fused where it pays (%zu layers, %.0f against %.0f there) %.0f (%.2fx)\n",
              paired, rows.size(), pairs_cudnn, pairs_fused, pairs_fused / pairs_cudnn, pointwise_cudnn,
              pointwise_fused, pointwise_fused / pointwise_cudnn, paying, paying_fused, paying_cudnn, where_it_pays,
              where_it_pays / pairs_cudnn);
  std::printf("numerics %s\n", numerics_ok ? "ok" : "WRONG");
  std::printf("BatchNorm given statistics against batch_norm_forward %s\n", batch_norm_ok ? "ok" : "FAILED");
  return numerics_ok && batch_norm_ok ? 0 : 2;
}
