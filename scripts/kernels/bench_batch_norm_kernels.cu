// Times ltrain's BatchNorm kernels alone (fp16), per shape, activation and launch shape: 50 launches
// of one kernel captured in a CUDA graph and replayed, so each figure includes its launch gap. For
// each shape it prints the plan batch_norm.cu picks, then every launch shape the register kernels
// take: the channels a block covers (64, 32, 16, 8), and the grid reduction or clusters of 1 to 8
// blocks, each with at most 8 rows a thread (a shape the plan streams: those that still hold it in
// registers, if any; the streaming kernels are not timed). Beside them, a copy of the same bytes
// (read x, write y) on a full device and an empty kernel: what a launch in this harness costs
// without any reduction.
// Includes the kernels' source to reach their internal launcher. Built by the target
// ltrain_bench_batch_norm_kernels (cmake/kernel_benchmarks.cmake); on a GPU host, from the repository:
//   cmake --build build --target ltrain_bench_batch_norm_kernels && build/ltrain_bench_batch_norm_kernels
// Arguments: `--tsv` prints one tab-separated line per measurement instead; `ROWS CHANNELS` measures
// that shape alone (repeatable); `--profile` launches each kernel once, outside any graph, untimed:
//   ncu --section SpeedOfLight --section WarpStateStats ltrain_bench_batch_norm_kernels --profile 1024 256
#include "../../src/kernels/batch_norm.cu"
#include "../../src/kernels/batch_norm_kernels.cu"
#include "bench_support.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace ltrain::kernels;

namespace bench {

struct Buffers {
  void *x, *residual, *y, *grad_y, *grad_x, *grad_residual;
  float *weight, *bias, *running_mean, *running_var, *saved_mean, *saved_inv_std, *grad_weight, *grad_bias;
};

/// fp16 tensors of `shape` (x = 1, residual = 0, grad_y = 1) and zeroed per-channel vectors.
Buffers allocate(const BatchNormShape& shape) {
  const int64_t elements = shape.rows * shape.channels;
  Buffers m;
  for (void** p : {&m.x, &m.residual, &m.y, &m.grad_y, &m.grad_x, &m.grad_residual})
    CHECK_CUDA(cudaMalloc(p, elements * 2));
  CHECK_CUDA(cudaMemset(m.x, 0x3c, elements * 2));  // 1.0 in fp16 bytes
  CHECK_CUDA(cudaMemset(m.residual, 0, elements * 2));
  CHECK_CUDA(cudaMemset(m.grad_y, 0x3c, elements * 2));
  for (float** p : {&m.weight, &m.bias, &m.running_mean, &m.running_var, &m.saved_mean, &m.saved_inv_std,
                    &m.grad_weight, &m.grad_bias}) {
    CHECK_CUDA(cudaMalloc(p, shape.channels * 4));
    CHECK_CUDA(cudaMemset(*p, 0, shape.channels * 4));
  }
  return m;
}

void release(const Buffers& m) {
  for (void* p : {m.x, m.residual, m.y, m.grad_y, m.grad_x, m.grad_residual}) cudaFree(p);
  for (float* p : {m.weight, m.bias, m.running_mean, m.running_var, m.saved_mean, m.saved_inv_std, m.grad_weight,
                   m.grad_bias})
    cudaFree(p);
}

BatchNormForward forward_arguments(const Buffers& m) {
  BatchNormForward a;
  a.x = m.x;
  a.residual = m.residual;
  a.y = m.y;
  a.weight = m.weight;
  a.bias = m.bias;
  a.running_mean = m.running_mean;
  a.running_var = m.running_var;
  a.saved_mean = m.saved_mean;
  a.saved_inv_std = m.saved_inv_std;
  return a;
}

BatchNormBackward backward_arguments(const Buffers& m) {
  BatchNormBackward a;
  a.x = m.x;
  a.y = m.y;
  a.grad_y = m.grad_y;
  a.grad_x = m.grad_x;
  a.grad_residual = m.grad_residual;
  a.weight = m.weight;
  a.bias = m.bias;
  a.saved_mean = m.saved_mean;
  a.saved_inv_std = m.saved_inv_std;
  a.grad_weight = m.grad_weight;
  a.grad_bias = m.grad_bias;
  return a;
}

/// With --profile: each kernel launched once, outside any graph, and not timed (for a profiler).
bool g_profile = false;

/// Microseconds a launch: 50 launches of `launch_one` captured in a graph, the graph replayed 4 times.
/// Negative where the launch or the graph failed.
template <typename Launch>
double time_us(cudaStream_t stream, Launch launch_one) {
  if (g_profile) {
    const bool launched = launch_one() == cudaSuccess && cudaStreamSynchronize(stream) == cudaSuccess;
    cudaGetLastError();
    return launched ? 0.0 : -1.0;
  }
  constexpr int kLaunches = 50, kReplays = 4;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < kLaunches; ++i) {
    if (launch_one() != cudaSuccess) {
      cudaStreamEndCapture(stream, &graph);
      cudaGetLastError();
      return -1;
    }
  }
  cudaStreamEndCapture(stream, &graph);
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  cudaGraphLaunch(exec, stream);
  cudaStreamSynchronize(stream);
  cudaEvent_t start, end;
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  cudaEventRecord(start, stream);
  for (int i = 0; i < kReplays; ++i) cudaGraphLaunch(exec, stream);
  cudaEventRecord(end, stream);
  cudaEventSynchronize(end);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, end);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (cudaGetLastError() != cudaSuccess) return -2;
  return ms * 1000.0 / (kLaunches * kReplays);
}

__global__ void copy_kernel(const uint4* from, uint4* to, int64_t vectors) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < vectors; i += int64_t{gridDim.x} * blockDim.x)
    to[i] = from[i];
}

__global__ void empty_kernel() {}

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::cluster: return "cluster";
    case Reduction::grid: return "grid";
    case Reduction::streaming: return "streaming";
    default: return "none";
  }
}

const char* activation_name(BatchNormActivation activation) {
  switch (activation) {
    case BatchNormActivation::none: return "none";
    case BatchNormActivation::relu: return "relu";
    default: return "add_relu";
  }
}

struct LaunchShape {
  Reduction reduction;
  int64_t row_groups, group_channels;
};

/// Every launch shape the register kernels (cluster, grid) can run `shape` with on this device, at
/// most kRowsPerThread rows a thread.
std::vector<LaunchShape> launch_shapes(BatchNormActivation activation, const BatchNormShape& shape) {
  const auto type = ElementType::float16;
  const KernelSet grid = kernels_of(type, activation, Reduction::grid);
  const KernelSet cluster = kernels_of(type, activation, Reduction::cluster);
  std::vector<LaunchShape> shapes;
  for (int64_t group_channels = batch_norm_detail::kGroupChannels; group_channels >= kVector; group_channels /= 2) {
    if (group_channels > shape.channels) continue;
    const int64_t channel_groups = shape.channels / group_channels;
    const int64_t lanes = lanes_of(group_channels);
    const int64_t fewest = fewest_row_groups(shape.rows, group_channels);
    if (fewest * channel_groups <= fewest_over(grid, resident_blocks))
      shapes.push_back({Reduction::grid, fewest, group_channels});
    for (int64_t blocks = 1; blocks <= 8; blocks *= 2) {
      if (blocks < fewest || (blocks - 1) * lanes >= shape.rows) continue;
      const int size = static_cast<int>(blocks);
      if (fewest_over(cluster, [size](const void* kernel) { return clusters_at_once(kernel, size); }) > 0)
        shapes.push_back({Reduction::cluster, blocks, group_channels});
    }
  }
  return shapes;
}

void print_row(bool tsv, const BatchNormShape& shape, const char* activation, const char* what, int64_t row_groups,
               int64_t group_channels, bool planned, double forward_us, double backward_us) {
  if (tsv) {
    std::printf("%ld\t%ld\t%s\t%s\t%ld\t%ld\t%d\t%.2f\t%.2f\n", static_cast<long>(shape.rows),
                static_cast<long>(shape.channels), activation, what, static_cast<long>(row_groups),
                static_cast<long>(group_channels), planned ? 1 : 0, forward_us, backward_us);
    return;
  }
  std::printf("  %-8s %-9s x %2ld, %2ld channels a block%s: forward %7.2f us  backward %7.2f us  sum %7.2f\n",
              activation, what, static_cast<long>(row_groups), static_cast<long>(group_channels),
              planned ? " (plan)" : "       ", forward_us, backward_us, forward_us + backward_us);
}

}  // namespace bench

using namespace bench;

int main(int argc, char** argv) {
  bool tsv = false;
  std::vector<BatchNormShape> shapes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tsv") == 0) {
      tsv = true;
    } else if (std::strcmp(argv[i], "--profile") == 0) {
      g_profile = true;
    } else if (i + 1 < argc) {
      shapes.push_back({std::atol(argv[i]), std::atol(argv[i + 1])});
      ++i;
    } else {
      std::fprintf(stderr, "usage: %s [--tsv] [--profile] [ROWS CHANNELS]...\n", argv[0]);
      return 2;
    }
  }
  if (shapes.empty()) {
    // ResNet-50's BatchNorm shapes (rows = batch x height x width) at 32x32 inputs: the imagenet stem
    // at batch 256 (the stem's 16x16, then 8x8 to 1x1), and larger ones of the cifar stem.
    shapes = {{65536, 64}, {16384, 64}, {16384, 256}, {4096, 128}, {4096, 512}, {1024, 256},
              {1024, 1024}, {256, 512}, {256, 2048}, {65536, 256}, {16384, 128}, {16384, 512},
              {4096, 256}, {4096, 1024}, {1024, 512}, {1024, 2048}};
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto type = ElementType::float16;
  if (tsv)
    std::printf("rows\tchannels\tactivation\tlaunch\trow_groups\tgroup_channels\tplanned\tforward_us\tbackward_us\n");
  for (const BatchNormShape& shape : shapes) {
    const int64_t elements = shape.rows * shape.channels;
    const Buffers m = allocate(shape);
    const BatchNormForward forward = forward_arguments(m);
    const BatchNormBackward backward = backward_arguments(m);
    accumulators_for(stream);  // made before any capture

    if (!tsv)
      std::printf("rows %6ld x channels %5ld\n", static_cast<long>(shape.rows), static_cast<long>(shape.channels));
    const int64_t vectors = elements / kVector;
    const int copy_blocks = current_device_limits().multiprocessors * 8;
    const double copy_us = time_us(stream, [&] {
      copy_kernel<<<copy_blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(m.x), static_cast<uint4*>(m.y),
                                                        vectors);
      return cudaGetLastError();
    });
    const double empty_us = time_us(stream, [&] {
      empty_kernel<<<1, 32, 0, stream>>>();
      return cudaGetLastError();
    });
    print_row(tsv, shape, "-", "copy", copy_blocks, 0, false, copy_us, empty_us);

    for (const BatchNormActivation activation : {BatchNormActivation::relu, BatchNormActivation::add_relu}) {
      const LaunchPlan plan = checked_plan_for(type, activation, shape);
      for (const LaunchShape& launch_shape : launch_shapes(activation, shape)) {
        const KernelSet kernels = kernels_of(type, activation, launch_shape.reduction);
        const double forward_us = time_us(stream, [&] {
          return launch(kernels.forward, launch_shape.reduction, shape, launch_shape.row_groups,
                        launch_shape.group_channels, forward, stream);
        });
        const double backward_us = time_us(stream, [&] {
          return launch(kernels.backward, launch_shape.reduction, shape, launch_shape.row_groups,
                        launch_shape.group_channels, backward, stream);
        });
        const bool planned = plan.reduction == launch_shape.reduction && plan.row_groups == launch_shape.row_groups &&
                             plan.group_channels == launch_shape.group_channels;
        print_row(tsv, shape, activation_name(activation), reduction_name(launch_shape.reduction),
                  launch_shape.row_groups, launch_shape.group_channels, planned, forward_us, backward_us);
      }
    }
    release(m);
  }
  return 0;
}
