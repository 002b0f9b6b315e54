#include "ltrain/core/interrupt.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "ltrain/core/errors.h"

namespace ltrain::interrupt {
namespace {

// The handler touches only these lock-free atomics and async-signal-safe calls.
std::atomic<int> g_signal{0};               // the first signal of the current request, 0 for none
std::atomic<int64_t> g_first_signal_ns{0};  // when it came (CLOCK_MONOTONIC)
std::atomic<bool> g_polled{false};          // a StopRequests scope is alive
int g_scopes = 0;                           // StopRequests scopes alive (the thread that makes them)
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free &&
                  std::atomic<bool>::is_always_lock_free,
              "the signal handler may only touch lock-free atomics");

constexpr int64_t kGraceNs = static_cast<int64_t>(kStopGraceSeconds * 1e9);
static_assert(kStopGraceSeconds == 2.0, "on_stop_signal's message says 2 s");

int64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

void write_stderr(const char* text, size_t length) {
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, length);
}

template <size_t N>
void write_stderr(const char (&text)[N]) {
  write_stderr(text, N - 1);
}

/// "\nltrain: stopped by signal N\n" without the allocating formatters.
void write_stopped_line(int signal_number) {
  char line[64] = "\nltrain: stopped by signal ";
  size_t length = sizeof "\nltrain: stopped by signal " - 1;
  char digits[12];
  size_t count = 0;
  for (int value = signal_number; value > 0 || count == 0; value /= 10) digits[count++] = static_cast<char>('0' + value % 10);
  while (count > 0) line[length++] = digits[--count];
  line[length++] = '\n';
  write_stderr(line, length);
}

extern "C" void on_stop_signal(int signal_number) {
  const int64_t now = monotonic_ns();
  if (g_signal.load() != 0) {
    if (now - g_first_signal_ns.load() < kGraceNs) return;  // the same request again
    write_stderr("\nltrain: second signal, exiting now without a checkpoint\n");
    ::_exit(static_cast<int>(ExitCode::interrupted));
  }
  if (!g_polled.load()) {  // nothing polls: nothing in progress can be saved
    write_stopped_line(signal_number);
    ::_exit(static_cast<int>(ExitCode::interrupted));
  }
  g_first_signal_ns.store(now);
  g_signal.store(signal_number);
  write_stderr("\nltrain: stopping with a checkpoint once this step or evaluation ends (with several processes: at "
               "the next log interval); a signal 2 s or more from now exits at once, without one\n");
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void install_stop_handlers() {
  if (g_installed.exchange(true)) return;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_mask = stop_signals();  // one handler at a time: the first signal is recorded whole
  action.sa_flags = SA_RESTART;     // blocking calls elsewhere (file writes) resume rather than fail
  for (const int signal_number : {SIGINT, SIGTERM}) {
    // A signal ignored from the start stays ignored (nohup, a shell's background job).
    struct sigaction inherited {};
    sigaction(signal_number, nullptr, &inherited);
    if (inherited.sa_handler != SIG_IGN) sigaction(signal_number, &action, nullptr);
  }
}

void unblock_stop_signals() {
  const sigset_t set = stop_signals();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

bool stop_requested() { return g_polled.load() && g_signal.load() != 0; }

int stop_signal() { return g_signal.load(); }

StopRequests::StopRequests() {
  install_stop_handlers();
  // A scope inside another (a sweep's training point) keeps the outer one's request.
  if (g_scopes++ > 0) return;
  // Cleared before polling starts: a signal in between finds no poller and ends the process.
  g_signal.store(0);
  g_polled.store(true);
}

StopRequests::~StopRequests() {
  if (--g_scopes > 0) return;
  // The request stays recorded: a repeat within the grace period is still the same request.
  g_polled.store(false);
}

}  // namespace ltrain::interrupt
