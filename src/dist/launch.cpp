#include "ltrain/dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/core/errors.h"

namespace ltrain::dist {

namespace {

// What the launcher's handler saw: how many SIGINT/SIGTERM so far, and the last one.
std::atomic<int> g_signals_received{0};
std::atomic<int> g_last_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler may only touch lock-free atomics");

extern "C" void remember_signal(int signal) {
  g_last_signal.store(signal);
  g_signals_received.fetch_add(1);
}

}  // namespace

int64_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw RunError("ltrain launch: cannot open a socket to find a free port; pass --master-port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int64_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  ::close(fd);
  if (port == 0) throw RunError("ltrain launch: cannot find a free port; pass --master-port");
  return port;
}

namespace {

struct Child {
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
};

void signal_running(std::vector<Child>& children, int signal) {
  for (const Child& child : children)
    if (child.running) ::kill(child.pid, signal);
}

}  // namespace

int launch(const LaunchOptions& options) {
  if (options.processes < 1) throw ConfigError(fmt::format("ltrain launch: -n {} must be at least 1", options.processes));
  if (options.command.empty())
    throw ConfigError("ltrain launch: no command after --; for example: ltrain launch -n 2 -- train --config C.json");
  const int64_t port = options.master_port > 0 ? options.master_port : free_port();

  std::vector<std::string> arguments{"ltrain"};
  arguments.insert(arguments.end(), options.command.begin(), options.command.end());
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);

  g_signals_received.store(0);
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_interrupt {}, old_terminate {};
  sigaction(SIGINT, &action, &old_interrupt);
  sigaction(SIGTERM, &action, &old_terminate);

  spdlog::info("launch: {} processes, rendezvous at 127.0.0.1:{}", options.processes, port);
  const pid_t launcher = ::getpid();
  std::vector<Child> children(static_cast<size_t>(options.processes));
  for (int64_t rank = 0; rank < options.processes; ++rank) {
    // A rank starts with SIGINT/SIGTERM blocked; ltrain's main unblocks them once its handlers are
    // installed, so a signal that comes while the rank loads is delivered then, not lost or fatal.
    sigset_t stop_signals, launcher_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop_signals, &launcher_mask);
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches the launcher alone, which passes it on
      // once (the rank would otherwise see two stop requests).
      ::setpgid(0, 0);
      // A launcher that dies (killed, its terminal closed) stops its ranks as SIGTERM does.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) std::_Exit(static_cast<int>(ExitCode::interrupted));
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(options.processes).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.processes).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execv("/proc/self/exe", argv.data());
      std::_Exit(127);
    }
    sigprocmask(SIG_SETMASK, &launcher_mask, nullptr);
    if (pid < 0) {
      signal_running(children, SIGKILL);
      throw RunError(fmt::format("ltrain launch: cannot start process {} (fork failed)", rank));
    }
    ::setpgid(pid, pid);  // also here, so that no signal finds it in the launcher's group
    children[static_cast<size_t>(rank)] = Child{pid, true, 0};
  }

  using Clock = std::chrono::steady_clock;
  int first_failure = 0;
  bool killing = false;  // SIGTERM sent after a failure; SIGKILL at kill_at
  Clock::time_point kill_at = Clock::now();
  int signals_forwarded = 0;
  size_t running = children.size();
  while (running > 0) {
    // Each signal is passed on once: the first asks every process to finish its step and
    // checkpoint, a later one (after the ranks' grace period) to exit at once.
    if (const int received = g_signals_received.load(); received > signals_forwarded) {
      signals_forwarded = received;
      signal_running(children, g_last_signal.load());
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t rank = 0; rank < children.size(); ++rank) {
        Child& child = children[rank];
        if (child.pid != pid) continue;
        child.running = false;
        --running;
        child.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (child.exit_code != 0 && first_failure == 0) {
          first_failure = child.exit_code;
          // After a forwarded signal the others are stopping already.
          if (running > 0 && signals_forwarded == 0) {
            spdlog::error("launch: rank {} exited with code {}; stopping the other processes", rank, child.exit_code);
            signal_running(children, SIGTERM);
            killing = true;
            kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(options.grace_seconds));
          }
        }
      }
      continue;
    }
    if (killing && Clock::now() >= kill_at) {
      spdlog::error("launch: processes still running {:.0f} s after SIGTERM: killing them", options.grace_seconds);
      signal_running(children, SIGKILL);
      killing = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_interrupt, nullptr);
  sigaction(SIGTERM, &old_terminate, nullptr);
  return first_failure;
}

}  // namespace ltrain::dist
