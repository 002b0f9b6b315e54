#pragma once
// CUDA graphs (work captured once, kernels recorded, not run, and replayed as one launch), side
// streams and event timing. The only file that touches LibTorch's CUDAGraph, stream and event API;
// on a CPU build the graph and branch entry points throw RunError (configs asking for graphs are
// refused before that, in engine::resolve_device); work ahead runs in place on a CPU.
#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

namespace ltrain::gpu {

/// True when this build can capture CUDA graphs.
bool cuda_graphs_available();

/// Runs `work` on a side stream of `device`, after the current stream's queued work and before
/// any work queued on it later. PyTorch asks for a few such warm-up runs before a capture: cuDNN
/// autotuning, lazy initialisation and the autograd engine's device threads happen there.
void run_on_side_stream(const torch::Device& device, const std::function<void()>& work);

/// The step's branch: a second stream of `device` (one per device, made on first use, at the
/// device's lowest priority) for work off the critical path. fork_to_branch runs `work` there
/// after everything queued so far on the current stream, and leaves the current stream free to go
/// on; join_branch makes the current stream wait for everything queued on the branch so far.
/// Inside a capture the two become parallel branches of the graph, which the GPU runs side by
/// side. `used` are tensors the work reads that the current stream made and may free before the
/// branch reads them: their memory is not reused until the branch's work is done (the caching
/// allocator's record_stream).
void fork_to_branch(const torch::Device& device, const std::function<void()>& work,
                    const std::vector<torch::Tensor>& used);
void join_branch(const torch::Device& device);
/// Whether everything queued on the branch of `device` so far has run (no wait).
bool branch_done(const torch::Device& device);

/// Work ahead of the step: a stream of `device` (one per device, made on first use, at the
/// lowest priority) where inputs are prepared while the work queued before on the current stream,
/// the step before, still runs. run_ahead queues `work` there, makes the current stream wait for
/// it, and returns what `work` returned, marked as read by the current stream (the caching
/// allocator's record_stream), so that its memory is not reused before that stream is done with
/// it. The work waits only for what the current stream had queued at the last settle_ahead: it
/// may read only tensors made before then. The host waits, before queuing more, until the GPU has
/// taken all but the last output: the memory held ahead stays bounded however far ahead of the GPU
/// the host runs. On a CPU device `work` just runs.
std::vector<torch::Tensor> run_ahead(const torch::Device& device,
                                     const std::function<std::vector<torch::Tensor>()>& work);
/// The stream of run_ahead and the current stream wait for each other's queued work: what the
/// current stream made so far is ready for the work ahead, and what the work ahead read may be
/// freed and written again on the current stream. Nothing on a CPU device.
void settle_ahead(const torch::Device& device);
/// Whether everything queued by run_ahead on `device` so far has run (no wait; true on a CPU).
bool ahead_done(const torch::Device& device);

/// Milliseconds that `work` takes on `device`: between two CUDA events on the current stream
/// (waits for them), or on the CPU between two clock reads around it.
double elapsed_ms(const torch::Device& device, const std::function<void()>& work);

/// The priority of the stream a graph is captured on. The kernels a capture records keep the
/// priority of the stream they were queued on, and LibTorch 2.11 instantiates its graphs to honour
/// them: where kernels of two branches wait for the same SMs, the higher one's blocks go first.
enum class StreamPriority { normal, high };

/// One captured CUDA graph and its private memory pool. Tensors that `enqueue` allocates live in
/// the pool and are rewritten at every replay; tensors it reads or writes that were allocated
/// before the capture (weights, optimizer state, static input buffers) keep their addresses.
class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// Records the work `enqueue` issues on `device` (on a side stream of `priority`, ordered after
  /// the current stream's queued work). Nothing runs. Host-side effects of `enqueue` happen once,
  /// now. `StreamPriority::high` puts the work queued on the capture's own stream, the critical
  /// path, above the branch's (fork_to_branch).
  void capture(const torch::Device& device, const std::function<void()>& enqueue,
               StreamPriority priority = StreamPriority::normal);

  /// Launches the captured work on the current stream (no host sync).
  void replay();

  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ltrain::gpu
