#include "ltrain/core/gpu.h"

#include <array>
#include <chrono>
#include <deque>
#include <mutex>

#include "ltrain/core/errors.h"

#if LTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ltrain::gpu {
namespace {
double clock_ms(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

#if LTRAIN_WITH_CUDA

bool cuda_graphs_available() { return true; }

namespace {
/// Makes `side` wait for the work queued so far on the current stream of its device.
void waits_for_current(const c10::cuda::CUDAStream& side) {
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(side.device_index()));
  queued.block(side);
}

/// A pool stream of `device` that waits for the current stream's queued work.
c10::cuda::CUDAStream side_stream_after_current(const torch::Device& device,
                                                StreamPriority priority = StreamPriority::normal) {
  c10::cuda::CUDAStream side =
      c10::cuda::getStreamFromPool(/*isHighPriority=*/priority == StreamPriority::high, device.index());
  waits_for_current(side);
  return side;
}

/// Makes the current stream of `device` wait for `side`'s queued work.
void current_waits_for(const torch::Device& device, const c10::cuda::CUDAStream& side) {
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(c10::cuda::getCurrentCUDAStream(device.index()));
}
}  // namespace

void run_on_side_stream(const torch::Device& device, const std::function<void()>& work) {
  const c10::cuda::CUDAStream side = side_stream_after_current(device);
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    work();
  }
  current_waits_for(device, side);
}

namespace {
/// The streams ltrain makes for itself, one of each kind per device.
enum class OwnStream { branch, ahead };

/// `which` stream of `device`, made once and kept for the process (as LibTorch keeps its stream
/// pools): a stream of its own rather than one of the pool's, which the current stream may be.
/// Created non-blocking at the lowest priority, so that where the GPU chooses, a critical path on a
/// stream of higher priority goes first (a capture of StreamPriority::high).
c10::cuda::CUDAStream own_stream(const torch::Device& device, OwnStream which) {
  static std::mutex mutex;
  static std::array<std::array<cudaStream_t, 64>, 2> streams{};
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < streams[0].size(), "ltrain's streams: device index ",
              index);
  const std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& stream = streams[static_cast<size_t>(which)][static_cast<size_t>(index)];
  if (stream == nullptr) {
    const c10::cuda::CUDAGuard device_guard(index);
    int least_priority = 0, greatest_priority = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
    C10_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, least_priority));
  }
  return c10::cuda::getStreamFromExternal(stream, index);
}

c10::cuda::CUDAStream branch_stream(const torch::Device& device) { return own_stream(device, OwnStream::branch); }
}  // namespace

void fork_to_branch(const torch::Device& device, const std::function<void()>& work,
                    const std::vector<torch::Tensor>& used) {
  const c10::cuda::CUDAStream branch = branch_stream(device);
  waits_for_current(branch);
  {
    const c10::cuda::CUDAStreamGuard on_branch(branch);
    work();
  }
  for (const torch::Tensor& tensor : used)
    if (tensor.defined()) c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), branch);
}

void join_branch(const torch::Device& device) { current_waits_for(device, branch_stream(device)); }

bool branch_done(const torch::Device& device) { return branch_stream(device).query(); }

namespace {
/// Where the current stream of each device took the last outputs of run_ahead, oldest first.
/// Their memory is freed on the host, and reused only once the GPU has passed that point: the
/// host, which may run many steps ahead of the GPU, waits before it makes more than a few.
std::deque<at::cuda::CUDAEvent>& outputs_taken(c10::DeviceIndex index) {
  static auto* taken = new std::array<std::deque<at::cuda::CUDAEvent>, 64>();  // kept for the process
  TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < taken->size(), "work ahead: device index ", index);
  return (*taken)[static_cast<size_t>(index)];
}
constexpr size_t kMostOutputsAhead = 2;
}  // namespace

std::vector<torch::Tensor> run_ahead(const torch::Device& device,
                                     const std::function<std::vector<torch::Tensor>()>& work) {
  if (!device.is_cuda()) return work();
  const c10::cuda::CUDAStream ahead = own_stream(device, OwnStream::ahead);
  std::deque<at::cuda::CUDAEvent>& taken = outputs_taken(ahead.device_index());
  for (; taken.size() >= kMostOutputsAhead; taken.pop_front()) taken.front().synchronize();
  std::vector<torch::Tensor> outputs;
  {
    const c10::cuda::CUDAStreamGuard on_ahead(ahead);
    outputs = work();
  }
  current_waits_for(device, ahead);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(ahead.device_index());
  for (const torch::Tensor& tensor : outputs)
    if (tensor.defined() && tensor.is_cuda())
      c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), current);
  taken.emplace_back();
  taken.back().record(current);
  return outputs;
}

void settle_ahead(const torch::Device& device) {
  if (!device.is_cuda()) return;
  const c10::cuda::CUDAStream ahead = own_stream(device, OwnStream::ahead);
  current_waits_for(device, ahead);
  waits_for_current(ahead);
}

bool ahead_done(const torch::Device& device) {
  return !device.is_cuda() || own_stream(device, OwnStream::ahead).query();
}

struct CudaGraph::Impl {
  at::cuda::CUDAGraph graph;
  bool captured = false;
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const torch::Device& device, const std::function<void()>& enqueue,
                        StreamPriority priority) {
  if (impl_->captured) throw std::logic_error("CudaGraph::capture called twice");
  const c10::cuda::CUDAStream side = side_stream_after_current(device, priority);
  {
    // Capture needs a stream other than the default one. Waiting once for everything queued keeps
    // the capture free of pending work from the warm-up; then the blocks the warm-up left cached
    // go back to the device (as torch.cuda.graph does): the allocator cannot free them while
    // capturing, so a step that needs half the GPU could not be captured after its warm-up.
    side.synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    const c10::cuda::CUDAStreamGuard on_side(side);
    impl_->graph.capture_begin();
    try {
      enqueue();
    } catch (...) {
      // End the capture so that the stream is usable again; the partial graph is discarded.
      try {
        impl_->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
  }
  current_waits_for(device, side);
  impl_->captured = true;
}

void CudaGraph::replay() { impl_->graph.replay(); }

double elapsed_ms(const torch::Device& device, const std::function<void()>& work) {
  if (!device.is_cuda()) return clock_ms(work);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
  start.record(stream);
  work();
  end.record(stream);
  end.synchronize();
  return static_cast<double>(start.elapsed_time(end));
}

bool CudaGraph::captured() const { return impl_->captured; }

#else

bool cuda_graphs_available() { return false; }

namespace {
[[noreturn]] void no_cuda() {
  throw RunError("CUDA graphs need a CUDA build of ltrain: build it on a GPU machine with bash scripts/setup.sh");
}
}  // namespace

void run_on_side_stream(const torch::Device&, const std::function<void()>&) { no_cuda(); }
void fork_to_branch(const torch::Device&, const std::function<void()>&, const std::vector<torch::Tensor>&) {
  no_cuda();
}
void join_branch(const torch::Device&) { no_cuda(); }
bool branch_done(const torch::Device&) { no_cuda(); }

std::vector<torch::Tensor> run_ahead(const torch::Device&, const std::function<std::vector<torch::Tensor>()>& work) {
  return work();
}
void settle_ahead(const torch::Device&) {}
bool ahead_done(const torch::Device&) { return true; }

double elapsed_ms(const torch::Device&, const std::function<void()>& work) { return clock_ms(work); }

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() { no_cuda(); }
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const torch::Device&, const std::function<void()>&, StreamPriority) { no_cuda(); }
void CudaGraph::replay() { no_cuda(); }
bool CudaGraph::captured() const { return false; }

#endif

}  // namespace ltrain::gpu
