#pragma once
// `ltrain launch -n N -- train ...`: torchrun's job on a host without it. Starts N copies of this
// executable with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1) and
// MASTER_PORT set, each in a process group of its own, so that a terminal's Ctrl-C reaches the
// launcher alone; it passes every SIGINT/SIGTERM on to them once. When one fails it stops the
// others (SIGTERM, then SIGKILL after a grace period) instead of leaving them waiting; when the
// launcher itself dies, its ranks get SIGTERM (they checkpoint and stop).
#include <cstdint>
#include <string>
#include <vector>

namespace ltrain::dist {

struct LaunchOptions {
  int64_t processes = 1;
  int64_t master_port = 0;          ///< 0: a free port chosen here
  std::vector<std::string> command;  ///< ltrain's arguments for each process: {"train", "--config", ...}
  double grace_seconds = 10.0;       ///< after SIGTERM, how long the others get before SIGKILL
};

/// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice).
int64_t free_port();

/// Runs the processes to the end. Returns 0 when every one succeeded, else the exit code of the
/// first that failed (128 + signal for one killed by a signal). ConfigError for bad options.
int launch(const LaunchOptions& options);

}  // namespace ltrain::dist
