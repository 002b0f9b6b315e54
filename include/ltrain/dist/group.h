#pragma once
// Data-parallel processes through PyTorch's c10d: torchrun's environment, a TCPStore rendezvous,
// and a Gloo (CPU) or NCCL (CUDA) process group. The only user of the c10d API; every failure of
// a collective (a peer that died, or one silent past distributed.timeout_s) becomes a PeerError
// (exit code 5) naming this rank.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ltrain/config/enums.h"

namespace ltrain::dist {

/// torchrun's variables (or `ltrain launch`'s, the same names). One node (machine) runs
/// local_world_size processes; with several, a process's global rank is node_rank *
/// local_world_size + local_rank.
struct Environment {
  int64_t rank = 0;              ///< RANK, 0 .. world_size - 1
  int64_t world_size = 1;        ///< WORLD_SIZE: processes on every node together
  int64_t local_rank = 0;        ///< LOCAL_RANK (default: RANK, one node): the GPU this process takes
  int64_t local_world_size = 1;  ///< LOCAL_WORLD_SIZE (default: WORLD_SIZE): processes on this node
  int64_t node_rank = 0;         ///< GROUP_RANK (torchrun) or NODE_RANK, default 0
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: the machine that serves the rendezvous
  int64_t master_port = 29500;            ///< MASTER_PORT
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves a TCPStore at MASTER_ADDR:MASTER_PORT,
  /// and every rank (0 too) connects to it instead of serving one there itself.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: which start of the workers this is; with the agent's store, which
  /// outlives a restart, each start keeps its keys apart.
  int64_t restart_count = 0;
};

/// The launcher's variables, or nullopt when WORLD_SIZE is unset (a single process).
/// ConfigError naming the variable when one is malformed or they disagree (RANK >= WORLD_SIZE).
std::optional<Environment> read_environment();

/// An asynchronous collective in flight.
class Pending {
 public:
  Pending() = default;
  /// Blocks the host (Gloo) or makes the current CUDA stream wait (NCCL) until it is done.
  void wait();
  bool empty() const { return !work_; }

 private:
  friend class Group;
  struct Work;
  Pending(std::shared_ptr<Work> work, int64_t rank) : work_(std::move(work)), rank_(rank) {}
  std::shared_ptr<Work> work_;
  int64_t rank_ = 0;
};

/// What a process group reads: the distributed section's keys of the same names (the others,
/// SyncBatchNorm, the buckets and the gradients' type, are the engine's and the GradientReducer's).
/// No defaults of its own: engine::group_options fills every field from config::DistributedSection,
/// the one place of the defaults.
struct GroupOptions {
  config::DistBackend backend;  ///< the c10d backend; auto: NCCL on CUDA devices, Gloo on the CPU
  double timeout_s;             ///< how long a rank waits for the others before a PeerError
};

class Group {
 public:
  /// Rendezvous of `environment.world_size` processes and the backend's process group for
  /// `device` (backend auto: NCCL on CUDA, Gloo on the CPU). PeerError when the others do not
  /// arrive within `options.timeout_s`; ConfigError for a backend this build or device cannot run.
  Group(const Environment& environment, const GroupOptions& options, const torch::Device& device);
  /// Without close() (an error on the way out): the backend is aborted, without the others.
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const Environment& environment() const { return environment_; }
  int64_t rank() const { return environment_.rank; }
  int64_t size() const { return environment_.world_size; }
  bool is_main() const { return environment_.rank == 0; }
  const char* backend_name() const { return backend_name_.c_str(); }

  /// Sums `tensors` over every rank, in place, asynchronously. Every rank must issue the same
  /// collectives in the same order.
  Pending all_reduce_sum(std::vector<torch::Tensor> tensors);
  /// Copies rank 0's values of `tensors` into every rank's, in place (blocks until done).
  void broadcast_from_main(std::vector<torch::Tensor> tensors);
  void barrier();
  /// The orderly end of a run, on every rank at the same point: a barrier, the backend shut down
  /// (NCCL: its communicators destroyed) and destroyed, and rank 0, when its process serves the
  /// TCPStore, leaving last (within 30 s), so that no rank's backend threads lose the store while
  /// they still read it. No collective after. Any CUDA graph that captured this group's
  /// collectives must be destroyed before.
  void close();
  /// Every rank's `text`, indexed by rank, through the store (for start-up checks).
  std::vector<std::string> all_gather_text(const std::string& key, const std::string& text);

 private:
  /// Runs `issue` (which starts one c10d collective and returns its work) as a Pending; a
  /// failure to start becomes a PeerError saying `what` failed.
  template <class Issue>
  Pending start(const char* what, Issue&& issue);

  struct Impl;
  Environment environment_;
  std::string backend_name_;
  bool serves_store_ = false;  // rank 0 without torchrun's agent store: its process serves the TCPStore
  std::unique_ptr<Impl> impl_;
};

/// Differentiable sum over ranks of `values` (a new tensor): the backward pass sums the
/// gradients over ranks too, so each rank gets the gradient of every rank's loss (SyncBatchNorm).
torch::Tensor all_reduce_sum_differentiable(Group& group, const torch::Tensor& values);

}  // namespace ltrain::dist
