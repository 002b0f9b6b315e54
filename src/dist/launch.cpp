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
#include <cstring>
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

/// What an exit code means, for the launcher's line.
std::string meaning_of(int exit_code) {
  switch (exit_code) {
    case 1: return " (internal error)";
    case 2: return " (usage or config error)";
    case 3: return " (data error)";
    case 4: return " (the run failed)";
    case 5: return " (another process failed or hung)";
    case 127: return " (could not be started)";
    case 130: return " (interrupted)";
    default: return "";
  }
}

std::string describe(const ProcessEnd& end) {
  if (end.signal != 0) {
    const char* name = ::strsignal(end.signal);
    return fmt::format("rank {} was killed by signal {}{}", end.rank, end.signal,
                       name ? fmt::format(" ({})", name) : std::string());
  }
  return fmt::format("rank {} exited with code {}{}", end.rank, end.exit_code, meaning_of(end.exit_code));
}

bool failed(const ProcessEnd& end) { return end.signal != 0 || end.exit_code != 0; }

/// Ended because another process failed: the launcher stopped it, or it exited with 5 (PeerError).
bool followed_another(const ProcessEnd& end) {
  // A signal the launcher did not send (the OOM killer's SIGKILL, say) is a failure of its own,
  // even when it lands after the launcher's SIGTERM.
  const bool stopped_by_launcher = (end.stopped && end.signal == 0 && end.exit_code == 130) ||
                                   (end.killed && end.signal == SIGKILL);
  const bool peer_failed = end.signal == 0 && end.exit_code == static_cast<int>(ExitCode::peer);
  return stopped_by_launcher || peer_failed;
}

}  // namespace

LaunchResult launch_result(const std::vector<ProcessEnd>& ends, bool interrupted) {
  std::vector<ProcessEnd> failures;
  for (const ProcessEnd& end : ends)
    if (failed(end)) failures.push_back(end);
  if (failures.empty()) return {0, ""};
  if (interrupted) return {static_cast<int>(ExitCode::interrupted), ""};  // each rank said where it stopped
  // The failures that were not another's consequence; if every one was (each rank timed out
  // waiting for the others, say), all of them.
  std::vector<ProcessEnd> causes;
  for (const ProcessEnd& end : failures)
    if (!followed_another(end)) causes.push_back(end);
  if (causes.empty()) causes = failures;
  const ProcessEnd& first = causes.front();
  bool agree = true;
  for (const ProcessEnd& end : causes) agree = agree && end.signal == 0 && end.exit_code == first.exit_code;
  if (agree) {
    // Every process failed alike on its own: their own lines say why.
    if (causes.size() == ends.size()) return {first.exit_code, ""};
    const std::string others =
        causes.size() > 1 ? fmt::format(", as did {} other(s)", causes.size() - 1) : std::string();
    return {first.exit_code,
            fmt::format("launch: {}{}; the other processes stopped after it", describe(first), others)};
  }
  return {static_cast<int>(ExitCode::peer),
          fmt::format("launch: {}; the other processes stopped after it; exit code 5 (a process failed)",
                      describe(first))};
}

namespace {

struct Child {
  pid_t pid = -1;
  int64_t rank = 0;  // global
  bool running = false;
  bool stopped = false;  // SIGTERM from the launcher, after another failed
  bool killed = false;   // and SIGKILL after the grace period
};

void signal_running(std::vector<Child>& children, int signal) {
  for (const Child& child : children)
    if (child.running) ::kill(child.pid, signal);
}

/// The variables a rank reads, all set by the launcher (none inherited from its own environment).
constexpr const char* kRankVariables[] = {"RANK",        "LOCAL_RANK",  "WORLD_SIZE",
                                          "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                                          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                                          "TORCHELASTIC_RESTART_COUNT"};

/// This process's environment without kRankVariables, plus `variables` ("NAME=value").
std::vector<std::string> child_environment(const std::vector<std::string>& variables) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool ours = false;
    for (const char* variable : kRankVariables) ours = ours || name == variable;
    if (!ours) environment.push_back(text);
  }
  environment.insert(environment.end(), variables.begin(), variables.end());
  return environment;
}

/// Pointers to `strings`' characters, null-terminated, for execve.
std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

int launch(const LaunchOptions& options) {
  constexpr int64_t kMaxWorldSize = 1 << 16;
  if (options.processes < 1) throw ConfigError(fmt::format("ltrain launch: -n {} must be at least 1", options.processes));
  if (options.nodes < 1) throw ConfigError(fmt::format("ltrain launch: --nnodes {} must be at least 1", options.nodes));
  if (options.node_rank < 0 || options.node_rank >= options.nodes)
    throw ConfigError(fmt::format("ltrain launch: --node-rank {} must be in 0..{} (--nnodes {})", options.node_rank,
                                  options.nodes - 1, options.nodes));
  if (options.nodes > 1 && (options.master_addr.empty() || options.master_port <= 0))
    throw ConfigError(fmt::format("ltrain launch --nnodes {}: give every node the same --master-addr (the address of "
                                  "node 0's machine) and --master-port (a free TCP port there)",
                                  options.nodes));
  if (options.processes * options.nodes > kMaxWorldSize)
    throw ConfigError(fmt::format("ltrain launch: {} nodes of {} processes are more than {} processes", options.nodes,
                                  options.processes, kMaxWorldSize));
  if (options.command.empty())
    throw ConfigError("ltrain launch: no command after --; for example: ltrain launch -n 2 -- train --config C.json");
  const int64_t port = options.master_port > 0 ? options.master_port : free_port();
  const std::string address = options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  const int64_t world_size = options.processes * options.nodes;
  const int64_t first_rank = options.node_rank * options.processes;

  // Everything a child needs is built here: between fork and exec it may only make
  // async-signal-safe calls (no allocation).
  std::vector<std::string> arguments{"ltrain"};
  arguments.insert(arguments.end(), options.command.begin(), options.command.end());
  std::vector<char*> argv = c_strings(arguments);
  std::vector<std::vector<std::string>> environments;
  std::vector<std::vector<char*>> envps;
  for (int64_t local_rank = 0; local_rank < options.processes; ++local_rank)
    environments.push_back(child_environment({
        fmt::format("RANK={}", first_rank + local_rank),
        fmt::format("LOCAL_RANK={}", local_rank),
        fmt::format("WORLD_SIZE={}", world_size),
        fmt::format("LOCAL_WORLD_SIZE={}", options.processes),
        fmt::format("GROUP_RANK={}", options.node_rank),
        fmt::format("MASTER_ADDR={}", address),
        fmt::format("MASTER_PORT={}", port),
    }));
  for (std::vector<std::string>& environment : environments) envps.push_back(c_strings(environment));

  g_signals_received.store(0);
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_interrupt {}, old_terminate {};
  sigaction(SIGINT, &action, &old_interrupt);
  sigaction(SIGTERM, &action, &old_terminate);

  if (options.nodes == 1)
    spdlog::info("launch: {} processes, rendezvous at {}:{}", options.processes, address, port);
  else
    spdlog::info("launch: node {} of {}: ranks {}..{} of {}, rendezvous at {}:{}", options.node_rank, options.nodes,
                 first_rank, first_rank + options.processes - 1, world_size, address, port);
  const pid_t launcher = ::getpid();
  std::vector<Child> children(static_cast<size_t>(options.processes));
  for (int64_t local_rank = 0; local_rank < options.processes; ++local_rank) {
    // A rank starts with SIGINT/SIGTERM blocked; ltrain's main unblocks them once its handlers are
    // installed, so a signal that comes while the rank loads is delivered then, not lost or fatal.
    sigset_t stop_signals, launcher_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop_signals, &launcher_mask);
    char* const* envp = envps[static_cast<size_t>(local_rank)].data();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches the launcher alone, which passes it on
      // once (the rank would otherwise see two stop requests).
      ::setpgid(0, 0);
      // A launcher that dies (killed, its terminal closed) stops its ranks as SIGTERM does.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) std::_Exit(static_cast<int>(ExitCode::interrupted));
      ::execve("/proc/self/exe", argv.data(), envp);
      std::_Exit(127);
    }
    sigprocmask(SIG_SETMASK, &launcher_mask, nullptr);
    if (pid < 0) {
      signal_running(children, SIGKILL);
      throw RunError(fmt::format("ltrain launch: cannot start rank {} (fork failed)", first_rank + local_rank));
    }
    ::setpgid(pid, pid);  // also here, so that no signal finds it in the launcher's group
    children[static_cast<size_t>(local_rank)] = Child{pid, first_rank + local_rank, true, false, false};
  }

  using Clock = std::chrono::steady_clock;
  std::vector<ProcessEnd> ends;
  bool stopping = false;  // SIGTERM sent after a failure
  bool killing = false;   // and SIGKILL due at kill_at
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
      for (Child& child : children) {
        if (child.pid != pid) continue;
        child.running = false;
        --running;
        ProcessEnd end;
        end.rank = child.rank;
        end.stopped = child.stopped;
        end.killed = child.killed;
        if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
        else end.signal = WTERMSIG(status);
        ends.push_back(end);
        // The first failure stops the others (after a forwarded signal they are stopping already).
        if (failed(end) && !stopping && running > 0 && signals_forwarded == 0) {
          for (Child& other : children) other.stopped = other.running;
          signal_running(children, SIGTERM);
          stopping = killing = true;
          kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options.grace_seconds));
        }
      }
      continue;
    }
    if (killing && Clock::now() >= kill_at) {
      spdlog::error("launch: processes still running {:.0f} s after SIGTERM: killing them", options.grace_seconds);
      for (Child& child : children) child.killed = child.running;
      signal_running(children, SIGKILL);
      killing = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_interrupt, nullptr);
  sigaction(SIGTERM, &old_terminate, nullptr);
  const LaunchResult result = launch_result(ends, signals_forwarded > 0);
  if (!result.message.empty()) spdlog::error("{}", result.message);
  return result.exit_code;
}

}  // namespace ltrain::dist
