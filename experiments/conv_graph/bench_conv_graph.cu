// ResNet-50's convolutions as cuDNN graphs (conv_graph.h), alone and with the BatchNorm
// work fused into them: first a check of each fused graph against a float64 reference on the CPU,
// then for every distinct convolution of the network at a batch size the time of the plain graph
// and of each fused one (the fastest of cuDNN's first candidates, 20 runs replayed from a CUDA
// graph), with the time summed over the network. On a GPU host, from the repository:
//   bash experiments/conv_graph/bench-conv-graph.sh [--dtype fp16|bf16] [--batch 256] [--stem imagenet|cifar]
//                                                   [--size 32] [--candidates 4] [--layers FIRST-LAST]
// --layers runs the distinct convolutions FIRST to LAST alone (1-based, in the table's order), so
// that a study whose run-time compiled engines take long (224x224) can be run in parts; the sums
// then cover those rows.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cudnn.h>

#include "../../scripts/kernels/bench_support.h"
#include "../../scripts/kernels/resnet50_layers.h"
#include "conv_graph.h"

using namespace ltrain::kernels;

namespace {

/// Host values already rounded to the element type, and their device copy.
struct Tensor {
  std::vector<float> host;
  void* device = nullptr;
  size_t elements = 0;
  bool is_float32 = false;
  Tensor(size_t n, bool float32, std::mt19937& rng, float low, float high) : elements(n), is_float32(float32) {
    std::uniform_real_distribution<float> d(low, high);
    host.resize(n);
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) {
      float v = d(rng);
      if (!float32) {
        bits[i] = from_float(v);
        v = to_float(bits[i]);
      }
      host[i] = v;
    }
    CHECK_CUDA(cudaMalloc(&device, n * (float32 ? 4 : 2) + 16));
    if (float32)
      CHECK_CUDA(cudaMemcpy(device, host.data(), n * 4, cudaMemcpyHostToDevice));
    else
      CHECK_CUDA(cudaMemcpy(device, bits.data(), n * 2, cudaMemcpyHostToDevice));
  }
  Tensor(const Tensor&) = delete;
  ~Tensor() { cudaFree(device); }
  std::vector<float> read() const {
    std::vector<float> out(elements);
    if (is_float32) {
      CHECK_CUDA(cudaMemcpy(out.data(), device, elements * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<uint16_t> bits(elements);
      CHECK_CUDA(cudaMemcpy(bits.data(), device, elements * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < elements; ++i) out[i] = to_float(bits[i]);
    }
    return out;
  }
};

/// Largest |a - b| / (|b| + floor) over the elements.
double worst_error(const std::vector<float>& got, const std::vector<double>& want, double floor) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / (std::fabs(want[i]) + floor));
  return worst;
}

/// Largest |a - b| / scale over the elements: for sums, whose terms' sizes set what rounding costs.
double worst_scaled_error(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& scale) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale[i]);
  return worst;
}

/// NHWC index of (n, c, h, w) in a [N, C, H, W] tensor.
size_t at(int64_t channels, int64_t height, int64_t width, int64_t n, int64_t c, int64_t h, int64_t w) {
  return static_cast<size_t>(((n * height + h) * width + w) * channels + c);
}

/// The fused forward and weight-gradient graphs against float64 on the CPU, on one small shape.
bool check_numerics(cudaStream_t stream) {
  const ConvShape s{4, 32, 8, 8, 64, 3, 1, 1};
  std::mt19937 rng(7);
  const int64_t P = s.out_height(), Q = s.out_width();
  Tensor x(s.batch * s.in_channels * s.height * s.width, false, rng, -2, 2);
  Tensor w(s.out_channels * s.in_channels * 9, false, rng, -0.2f, 0.2f);
  Tensor scale(s.in_channels, true, rng, 0.5f, 1.5f), bias(s.in_channels, true, rng, -0.5f, 0.5f);
  Tensor y(s.batch * s.out_channels * P * Q, false, rng, 0, 0);
  Tensor sum(s.out_channels, true, rng, 0, 0), square_sum(s.out_channels, true, rng, 0, 0);
  Tensor grad_y(s.batch * s.out_channels * P * Q, false, rng, -1, 1);
  Tensor grad_w(s.out_channels * s.in_channels * 9, false, rng, 0, 0);

  // The activation as the graph sees it: float32 relu(x * scale + bias), then the element type
  // for the tensor cores.
  std::vector<double> a(x.elements);
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t c = i % static_cast<size_t>(s.in_channels);
    a[i] = to_float(from_float(std::max(0.0f, x.host[i] * scale.host[c] + bias.host[c])));
  }
  std::vector<double> want_y(y.elements, 0.0), want_sum(s.out_channels, 0.0), want_square(s.out_channels, 0.0);
  std::vector<double> sum_of_magnitudes(s.out_channels, 0.0);
  std::vector<double> want_dw(grad_w.elements, 0.0);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t k = 0; k < s.out_channels; ++k) {
          double acc = 0;
          const size_t yi = at(s.out_channels, P, Q, n, k, p, q);
          for (int64_t r = 0; r < 3; ++r)
            for (int64_t t = 0; t < 3; ++t) {
              const int64_t h = p - 1 + r, ww = q - 1 + t;
              if (h < 0 || h >= s.height || ww < 0 || ww >= s.width) continue;
              for (int64_t c = 0; c < s.in_channels; ++c) {
                const size_t xi = at(s.in_channels, s.height, s.width, n, c, h, ww);
                const size_t wi = static_cast<size_t>(((k * 3 + r) * 3 + t) * s.in_channels + c);
                acc += a[xi] * w.host[wi];
                want_dw[wi] += a[xi] * grad_y.host[yi];
              }
            }
          want_y[yi] = acc;
          want_sum[static_cast<size_t>(k)] += acc;
          want_square[static_cast<size_t>(k)] += acc * acc;
          sum_of_magnitudes[static_cast<size_t>(k)] += std::fabs(acc);
        }

  bool ok = true;
  auto run_one = [&](ConvPass pass, ConvFusion fusion) -> const char* {
    std::string why;
    auto plans = ConvGraph::candidates(g_type, pass, s, fusion, 1, &why);
    if (plans.empty()) {
      std::printf("  %-70s not supported: %s\n", describe(pass, fusion).c_str(), why.c_str());
      return nullptr;
    }
    const ConvGraph& plan = *plans[0];
    // The parameters in the plan's type.
    Tensor scale_typed(s.in_channels, false, rng, 0, 0), bias_typed(s.in_channels, false, rng, 0, 0);
    const bool float_parameters = plan.scale_bias_type() == ElementType::float32;
    if (!float_parameters) {
      std::vector<uint16_t> bits(s.in_channels);
      for (int64_t c = 0; c < s.in_channels; ++c) bits[c] = from_float(scale.host[c]);
      CHECK_CUDA(cudaMemcpy(scale_typed.device, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
      for (int64_t c = 0; c < s.in_channels; ++c) bits[c] = from_float(bias.host[c]);
      CHECK_CUDA(cudaMemcpy(bias_typed.device, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    }
    void* workspace = nullptr;
    CHECK_CUDA(cudaMalloc(&workspace, plan.workspace_bytes() + 16));
    ConvBuffers buffers;
    buffers.x = x.device;
    buffers.weight = w.device;
    buffers.y = y.device;
    buffers.grad_y = grad_y.device;
    buffers.grad_weight = grad_w.device;
    buffers.scale = float_parameters ? scale.device : scale_typed.device;
    buffers.bias = float_parameters ? bias.device : bias_typed.device;
    buffers.sum = static_cast<float*>(sum.device);
    buffers.square_sum = static_cast<float*>(square_sum.device);
    const std::string error = plan.run(buffers, workspace, stream);
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaFree(workspace);
    if (!error.empty()) {
      std::printf("  %-70s run failed: %s\n", describe(pass, fusion).c_str(), error.c_str());
      ok = false;
      return nullptr;
    }
    static std::string engine;
    engine = plan.engine() + (float_parameters ? "" : ", scale and bias in the tensors' type");
    return engine.c_str();
  };

  const double tolerance = g_type == ElementType::float16 ? 1e-2 : 4e-2;
  if (const char* engine = run_one(ConvPass::forward, {true, true})) {
    const double ey = worst_error(y.read(), want_y, 1.0),
                 es = worst_scaled_error(sum.read(), want_sum, sum_of_magnitudes),
                 eq = worst_error(square_sum.read(), want_square, 1.0);
    const bool pass = ey < tolerance && es < tolerance && eq < tolerance;
    ok = ok && pass;
    std::printf("  %-70s %s: y %.1e, sum %.1e, sum of squares %.1e (%s)\n",
                describe(ConvPass::forward, {true, true}).c_str(), pass ? "ok" : "WRONG", ey, es, eq, engine);
  }
  if (const char* engine = run_one(ConvPass::backward_filter, {true, false})) {
    const double e = worst_error(grad_w.read(), want_dw, 1.0);
    ok = ok && e < tolerance;
    std::printf("  %-70s %s: weight gradient %.1e (%s)\n", describe(ConvPass::backward_filter, {true, false}).c_str(),
                e < tolerance ? "ok" : "WRONG", e, engine);
  }
  return ok;
}

/// Microseconds per run of the fastest of `plans` (20 runs captured in a CUDA graph, replayed 3
/// times after one replay to warm up); -1 where none runs.
double time_best(cudaStream_t stream, std::vector<std::unique_ptr<ConvGraph>>& plans,
                 const ConvBuffers& buffers, std::string* engine) {
  double best = -1;
  for (auto& plan : plans) {
    void* workspace = nullptr;
    if (cudaMalloc(&workspace, plan->workspace_bytes() + 16) != cudaSuccess) continue;
    if (!plan->run(buffers, workspace, stream).empty()) {
      cudaFree(workspace);
      continue;
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    const int runs = 20;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    bool captured = true;
    for (int i = 0; i < runs; ++i) captured = captured && plan->run(buffers, workspace, stream).empty();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    if (!captured || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      std::printf("    (%s: not capturable)\n", plan->engine().c_str());
      cudaGetLastError();
      cudaGraphDestroy(graph);
      cudaFree(workspace);
      continue;
    }
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, stream);
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    cudaEventRecord(stop, stream);
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    const double us = ms * 1000.0 / (3 * runs);
    if (best < 0 || us < best) {
      best = us;
      *engine = plan->engine();
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(workspace);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  g_type = ElementType::float16;
  int64_t batch = 256;
  bool imagenet_stem = true;
  int64_t image_size = 32;  // the images' side
  int candidates = 4;
  size_t first_layer = 1, last_layer = SIZE_MAX;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dtype") g_type = value == "bf16" ? ElementType::bfloat16 : ElementType::float16;
    else if (flag == "--batch") batch = std::atoll(value.c_str());
    else if (flag == "--stem") imagenet_stem = value != "cifar";
    else if (flag == "--candidates") candidates = std::atoi(value.c_str());
    else if (flag == "--size") image_size = std::atoll(value.c_str());
    else if (flag == "--layers" && (std::sscanf(value.c_str(), "%zu-%zu", &first_layer, &last_layer) != 2 ||
                                    first_layer < 1 || first_layer > last_layer)) {
      std::fprintf(stderr, "--layers %s: give FIRST-LAST, 1 <= FIRST <= LAST, as 4-24\n", value.c_str());
      return 2;
    }
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("cuDNN %zu, %s\n", cudnnGetVersion(), g_type == ElementType::float16 ? "fp16" : "bf16");

  std::printf("numerics, against float64 on the CPU:\n");
  const bool numerics_ok = check_numerics(stream);

  std::printf("\nResNet-50 convolutions, %s stem, %lldx%lld images, batch %lld, us a run "
              "(fastest of %d candidates):\n",
              imagenet_stem ? "imagenet" : "cifar", static_cast<long long>(image_size),
              static_cast<long long>(image_size), static_cast<long long>(batch), candidates);
  std::printf("| conv (C->K, k/s, side) | n | fwd | fwd+stats | sbr+fwd+stats | wgrad | sbr+wgrad | dgrad | sbr+fwd |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  struct Variant { ConvPass pass; ConvFusion fusion; bool needs_normalized_input; };
  const Variant variants[] = {{ConvPass::forward, {false, false}, false},
                              {ConvPass::forward, {false, true}, false},
                              {ConvPass::forward, {true, true}, true},
                              {ConvPass::backward_filter, {false, false}, false},
                              {ConvPass::backward_filter, {true, false}, true},
                              {ConvPass::backward_data, {false, false}, false},
                              {ConvPass::forward, {true, false}, true}};
  // Summed over the network: today's plan (plain forward and gradients) and the fused one (the
  // prologue where the input is a BatchNorm output read by this convolution alone, statistics
  // from every forward), each falling back to the plain graph where its fused one does not run.
  double plain_forward = 0, fused_forward = 0, plain_filter = 0, fused_filter = 0, data = 0;
  std::mt19937 rng(1);
  const std::vector<Layer> layers = resnet50_layers(batch, image_size, imagenet_stem);
  const size_t last_row = std::min(last_layer, layers.size());
  for (size_t row = first_layer; row <= last_row; ++row) {
    const Layer& layer = layers[row - 1];
    const ConvShape& s = layer.shape;
    const size_t x_n = s.batch * s.in_channels * s.height * s.width;
    const size_t y_n = s.batch * s.out_channels * s.out_height() * s.out_width();
    const size_t w_n = s.out_channels * s.in_channels * s.kernel * s.kernel;
    Tensor x(x_n, false, rng, -1, 1), y(y_n, false, rng, 0, 0), w(w_n, false, rng, -0.05f, 0.05f);
    Tensor dy(y_n, false, rng, -1, 1), dx(x_n, false, rng, 0, 0), dw(w_n, false, rng, 0, 0);
    Tensor scale(s.in_channels, true, rng, 0.5f, 1.5f), bias(s.in_channels, true, rng, -0.5f, 0.5f);
    Tensor sum(s.out_channels, true, rng, 0, 0), square_sum(s.out_channels, true, rng, 0, 0);
    ConvBuffers buffers;
    buffers.x = x.device;
    buffers.weight = w.device;
    buffers.y = y.device;
    buffers.grad_y = dy.device;
    buffers.grad_x = dx.device;
    buffers.grad_weight = dw.device;
    buffers.scale = scale.device;  // float32 (a plan that wants the tensors' type reads other values: same time)
    buffers.bias = bias.device;
    buffers.sum = static_cast<float*>(sum.device);
    buffers.square_sum = static_cast<float*>(square_sum.device);
    std::printf("| %lld->%lld, %lld/%lld, %lld | %d |", static_cast<long long>(s.in_channels),
                static_cast<long long>(s.out_channels), static_cast<long long>(s.kernel),
                static_cast<long long>(s.stride), static_cast<long long>(s.height), layer.count);
    std::string notes;
    double us[7];
    for (int v = 0; v < 7; ++v) {
      const Variant& variant = variants[v];
      us[v] = -1;
      if (variant.needs_normalized_input && !layer.normalized_input) {
        std::printf(" - |");
        continue;
      }
      std::string why, engine;
      auto plans = ConvGraph::candidates(g_type, variant.pass, s, variant.fusion, candidates, &why);
      us[v] = plans.empty() ? -1 : time_best(stream, plans, buffers, &engine);
      if (us[v] < 0) {
        std::printf(" n/a |");
        notes += "  " + describe(variant.pass, variant.fusion) + ": " + (plans.empty() ? why : "no plan ran") + "\n";
      } else {
        std::printf(" %.1f |", us[v]);
        if (v == 2 || v == 4 || v == 6) notes += "  " + describe(variant.pass, variant.fusion) + ": " + engine + "\n";
      }
    }
    std::printf("\n%s", notes.c_str());
    auto first_ran = [](double a, double b) { return a >= 0 ? a : b; };
    plain_forward += layer.count * us[0];
    fused_forward += layer.count * first_ran(us[2], first_ran(us[1], us[0]));
    plain_filter += layer.count * us[3];
    fused_filter += layer.count * first_ran(us[4], us[3]);
    data += layer.count * us[5];
  }
  const bool all_layers = first_layer == 1 && last_row == layers.size();
  std::printf("\nsum over %s, us: forward %.0f plain, %.0f fused; weight gradient %.0f plain, %.0f fused; "
              "data gradient %.0f\n",
              all_layers ? "the network"
                         : ("rows " + std::to_string(first_layer) + "-" + std::to_string(last_row)).c_str(),
              plain_forward, fused_forward, plain_filter, fused_filter, data);
  std::printf("numerics %s\n", numerics_ok ? "ok" : "WRONG");
  return numerics_ok ? 0 : 2;
}
