#include "ltrain/core/interrupt.h"

#include <unistd.h>

#include <atomic>

#include "ltrain/core/errors.h"

namespace ltrain {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler may only touch lock-free atomics");

extern "C" void on_stop_signal(int signal_number) {
  if (g_signal.exchange(signal_number) != 0) {
    // Only async-signal-safe calls here.
    constexpr char kMessage[] = "\nltrain: second signal, exiting now without a checkpoint\n";
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(static_cast<int>(ExitCode::interrupted));
  }
  constexpr char kMessage[] = "\nltrain: stopping after this step and writing a checkpoint (signal again to exit now)\n";
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

}  // namespace

InterruptHandler::InterruptHandler() {
  g_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls elsewhere (file writes) resume rather than fail
  sigaction(SIGINT, &action, &previous_interrupt_);
  sigaction(SIGTERM, &action, &previous_terminate_);
}

InterruptHandler::~InterruptHandler() {
  sigaction(SIGINT, &previous_interrupt_, nullptr);
  sigaction(SIGTERM, &previous_terminate_, nullptr);
}

bool InterruptHandler::requested() { return g_signal.load() != 0; }

int InterruptHandler::signal_number() { return g_signal.load(); }

}  // namespace ltrain
