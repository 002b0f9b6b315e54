// Times ltrain's BatchNorm kernels alone (fp16, add+ReLU), per shape and way of reducing: 50 launches
// of one kernel captured in a CUDA graph and replayed, so each figure includes its launch gap. Prints
// the plan batch_norm.cu picks, then the grid reduction and clusters of 1, 2, 4 and 8 blocks.
// Includes the kernels' source to reach their internal launcher. Built by the target
// ltrain_bench_batch_norm_kernels (cmake/kernel_benchmarks.cmake); on a GPU host, from the repository:
//   cmake --build build --target ltrain_bench_batch_norm_kernels && build/ltrain_bench_batch_norm_kernels
#include "../../src/kernels/batch_norm.cu"
#include "../../src/kernels/batch_norm_kernels.cu"
#include <cstdio>
#include <vector>
using namespace ltrain::kernels;

struct Buffers { void *x, *r, *y, *dy, *dx, *dr; float *w, *b, *rm, *rv, *sm, *si, *gw, *gb; };

template <typename F>
double time_us(cudaStream_t s, F launch_one) {
  const int reps = 50;
  cudaGraph_t graph; cudaGraphExec_t exec;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < reps; ++i) {
    cudaError_t e = launch_one();
    if (e != cudaSuccess) { printf("  launch: %s\n", cudaGetErrorString(e)); cudaStreamEndCapture(s, &graph); cudaGetLastError(); return -1; }
  }
  cudaStreamEndCapture(s, &graph);
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) { cudaGetLastError(); return -1; }
  cudaGraphLaunch(exec, s); cudaStreamSynchronize(s);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < 4; ++i) cudaGraphLaunch(exec, s);
  cudaEventRecord(b, s); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  cudaGraphExecDestroy(exec); cudaGraphDestroy(graph);
  if (cudaGetLastError() != cudaSuccess) return -2;
  return ms * 1000 / (4 * reps);
}

int main() {
  struct Case { long rows, channels; };
  const std::vector<Case> cases = {{256, 512}, {256, 2048}, {1024, 256}, {1024, 1024}, {4096, 128}, {4096, 512},
                                   {2048, 1024}, {8192, 128}, {16384, 64}, {16384, 256}, {65536, 64}};
  cudaStream_t s; cudaStreamCreate(&s);
  const auto type = ElementType::float16;
  const auto act = BatchNormActivation::add_relu;
  for (const Case& c : cases) {
    const BatchNormShape shape{c.rows, c.channels};
    const long n = c.rows * c.channels;
    Buffers m;
    for (void** p : {&m.x, &m.r, &m.y, &m.dy, &m.dx, &m.dr}) cudaMalloc(p, n * 2);
    cudaMemset(m.x, 0x3c, n * 2); cudaMemset(m.r, 0, n * 2); cudaMemset(m.dy, 0x3c, n * 2);
    for (float** p : {&m.w, &m.b, &m.rm, &m.rv, &m.sm, &m.si, &m.gw, &m.gb}) { cudaMalloc(p, c.channels * 4); cudaMemset(*p, 0, c.channels * 4); }
    BatchNormForward f; f.x = m.x; f.residual = m.r; f.y = m.y; f.weight = m.w; f.bias = m.b; f.running_mean = m.rm; f.running_var = m.rv;
    f.saved_mean = m.sm; f.saved_inv_std = m.si;
    BatchNormBackward g; g.x = m.x; g.y = m.y; g.grad_y = m.dy; g.grad_x = m.dx; g.grad_residual = m.dr; g.weight = m.w; g.bias = m.b; g.saved_mean = m.sm;
    g.saved_inv_std = m.si; g.grad_weight = m.gw; g.grad_bias = m.gb;
    accumulators_for(s);  // made before any capture
    const LaunchPlan plan = checked_plan_for(type, act, shape);
    const long gc = group_channels_of(c.channels), cgroups = c.channels / gc, lanes = kThreads / (gc / kVector);
    const long fewest = ceil_div(c.rows, lanes * kRowsPerThread);
    printf("rows %6ld C %5ld: plan %s x %ld (fewest %ld, channel groups %ld)\n", c.rows, c.channels,
           plan.reduction == Reduction::cluster ? "cluster" : plan.reduction == Reduction::grid ? "grid" : "none",
           (long)plan.row_groups, fewest, cgroups);
    struct Variant { Reduction r; long groups; };
    std::vector<Variant> variants;
    const KernelSet grid = kernels_of(type, act, Reduction::grid), cluster = kernels_of(type, act, Reduction::cluster);
    if (fewest * cgroups <= std::min(resident_blocks(grid.forward), resident_blocks(grid.backward))) variants.push_back({Reduction::grid, fewest});
    for (long gr = fewest; gr <= 8; gr *= 2) if (clusters_at_once(cluster.forward, gr) > 0 && clusters_at_once(cluster.backward, gr) > 0) variants.push_back({Reduction::cluster, gr});
    if (plan.reduction == Reduction::cluster) variants.push_back({Reduction::cluster, plan.row_groups});
    for (const Variant& v : variants) {
      const KernelSet k = v.r == Reduction::grid ? grid : cluster;
      const double fw = time_us(s, [&] { return launch(k.forward, v.r, shape, v.groups, f, s); });
      const double bw = time_us(s, [&] { return launch(k.backward, v.r, shape, v.groups, g, s); });
      printf("  %-7s x %2ld (clusters at once %3d): forward %7.2f us  backward %7.2f us\n", v.r == Reduction::grid ? "grid" : "cluster",
             v.groups, v.r == Reduction::cluster ? clusters_at_once(cluster.forward, (int)v.groups) : 0, fw, bw);
    }
    for (void* p : {m.x, m.r, m.y, m.dy, m.dx, m.dr}) cudaFree(p);
    for (float* p : {m.w, m.b, m.rm, m.rv, m.sm, m.si, m.gw, m.gb}) cudaFree(p);
  }
}
