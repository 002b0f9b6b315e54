#pragma once
// SIGINT and SIGTERM as a request to stop that the training loop polls between steps: it
// finishes the step, writes a checkpoint and exits 130. A second signal ends the process at once
// (exit 130), for a user who does not want to wait.
#include <csignal>

namespace ltrain {

class InterruptHandler {
 public:
  /// Installs the handlers and clears any earlier request.
  InterruptHandler();
  /// Puts the previous handlers back.
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

  /// True once SIGINT or SIGTERM has arrived.
  static bool requested();
  /// The signal that arrived (0 if none).
  static int signal_number();

 private:
  struct sigaction previous_interrupt_ {};
  struct sigaction previous_terminate_ {};
};

}  // namespace ltrain
