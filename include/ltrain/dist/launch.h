#pragma once
// `ltrain launch -n N -- train ...`: torchrun's job on a host without it. Starts N copies of this
// executable with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
// MASTER_PORT set, each in a process group of its own, so that a terminal's Ctrl-C reaches the
// launcher alone; it passes every SIGINT/SIGTERM on to them once. When one fails it stops the
// others (SIGTERM, then SIGKILL after a grace period) instead of leaving them waiting; when the
// launcher itself dies, its ranks get SIGTERM (they checkpoint and stop). On several machines
// (nodes) one launcher runs on each, with --nnodes, its --node-rank and the same --master-addr
// and --master-port: node R's N processes are global ranks R*N .. R*N+N-1, and global rank 0
// (on node 0) serves the rendezvous.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ltrain::dist {

/// The most processes on one node, nodes, and processes in all.
constexpr int64_t kMaxProcessesPerNode = 256;
constexpr int64_t kMaxNodes = 4096;
constexpr int64_t kMaxWorldSize = 1 << 16;

/// `ltrain launch`'s options (-n, --nnodes, --node-rank, --master-addr, --master-port, then the
/// command after --); check_launch_options holds their limits.
struct LaunchOptions {
  int64_t processes = 1;                   ///< on this node, 1 .. kMaxProcessesPerNode
  int64_t nodes = 1;                       ///< machines, one launcher each, 1 .. kMaxNodes
  int64_t node_rank = 0;                   ///< this machine's place among them, 0 .. nodes - 1
  std::optional<std::string> master_addr;  ///< the machine of node 0; left out: 127.0.0.1 (one node only)
  std::optional<int64_t> master_port;      ///< 1 .. 65535; left out: a free port chosen here (one node only)
  std::vector<std::string> command;        ///< ltrain's arguments for each process: {"train", "--config", ...}
  double grace_seconds = 10.0;             ///< after SIGTERM, how long the others get before SIGKILL
};

/// ConfigError, naming the option as `ltrain launch` spells it, for the first value out of its
/// range (above), an empty --master-addr, several nodes without the master's address and port,
/// more than kMaxWorldSize processes in all, or no command.
void check_launch_options(const LaunchOptions& options);

/// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice).
int64_t free_port();

/// How one process ended, as its launcher saw it.
struct ProcessEnd {
  int64_t rank = 0;      ///< global rank
  int exit_code = 0;     ///< its exit code, when it exited
  int signal = 0;        ///< the signal that killed it (exit_code is then unused); 0 if it exited
  bool stopped = false;  ///< the launcher had sent it SIGTERM after another failed
  bool killed = false;   ///< and SIGKILL, the grace period past
};

/// The launcher's exit code, and one line for the user (empty when the processes' own lines say it all).
struct LaunchResult {
  int exit_code = 0;
  std::string message;
};

/// The rule for the launcher's exit code, from how its processes ended (in the order they ended):
/// 0 when every one succeeded; 130 when the launcher was interrupted (`interrupted`: a SIGINT or
/// SIGTERM it passed on); else the exit code of every process that failed, when they agree (2
/// when each rejected the config, 3 for data, 4 for a run that failed on its own); else 5,
/// naming the first that failed and its exit code or signal. A process the launcher stopped,
/// and one that exited with 5 because another had failed, count as failed only when no other
/// did.
LaunchResult launch_result(const std::vector<ProcessEnd>& ends, bool interrupted);

/// Runs this node's processes to the end; returns launch_result's exit code, after logging its
/// line. ConfigError for bad options (check_launch_options).
int launch(const LaunchOptions& options);

}  // namespace ltrain::dist
