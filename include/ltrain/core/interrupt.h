#pragma once
// SIGINT and SIGTERM as a request to stop.
//
// `install_stop_handlers` (ltrain-core's first code: before the shared libraries' initializers, and
// again in main) makes them so for the whole life of the process. Until then the ltrain launcher
// (app/launcher.cpp) holds both signals blocked: one that comes while the loader works waits.
// While a `StopRequests` scope is alive (a training run, its set-up included), a signal only sets
// a flag that the run polls: set-up stops before anything is written, the training loop finishes
// its step, writes a checkpoint and stops (exit code 130). Signals within kStopGraceSeconds of
// the first are the same request (a terminal's Ctrl-C and the launcher's copy of it, torchrun's
// SIGINT followed by SIGTERM); one that comes later ends the process at once (exit 130) without a
// checkpoint, for a user who does not want to wait. With no scope alive nothing polls: a signal
// ends the process at once, with one line and exit code 130.

namespace ltrain::interrupt {

/// Signals this long (seconds) after the first one repeat its request instead of forcing an exit.
inline constexpr double kStopGraceSeconds = 2.0;

/// Installs the SIGINT and SIGTERM handlers for the rest of the process (again: no effect). A
/// signal that the process was started with ignored stays ignored.
void install_stop_handlers();

/// Unblocks SIGINT and SIGTERM, which the ltrain launcher and `ltrain launch` (in a rank) block
/// until the handlers exist (a signal that came meanwhile is delivered now).
void unblock_stop_signals();

/// True once SIGINT or SIGTERM arrived since the current StopRequests scope began (false while
/// none is alive: then a signal ends the process at once).
bool stop_requested();

/// The signal that asked to stop (0 if none).
int stop_signal();

/// While alive, SIGINT and SIGTERM are stop requests that its owner polls. Clears any earlier
/// request when it begins (installing the handlers if main did not). A scope made while another
/// is alive (a training run inside a sweep) adds nothing: the outer scope's request holds, and
/// signals stay requests until the outer one ends.
class StopRequests {
 public:
  StopRequests();
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
};

}  // namespace ltrain::interrupt
