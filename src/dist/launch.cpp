#include "ltrain/dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

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

void check_launch_options(const LaunchOptions& options) {
  constexpr int64_t kMaxPort = 65535;
  if (options.processes < 1 || options.processes > kMaxProcessesPerNode)
    throw ConfigError(fmt::format("ltrain launch: -n {}: expected 1 to {} processes (one per GPU on a GPU host)",
                                  options.processes, kMaxProcessesPerNode));
  if (options.nodes < 1 || options.nodes > kMaxNodes)
    throw ConfigError(fmt::format("ltrain launch: --nnodes {}: expected 1 to {} machines", options.nodes, kMaxNodes));
  if (options.node_rank < 0 || options.node_rank >= options.nodes)
    throw ConfigError(fmt::format("ltrain launch: --node-rank {} must be in 0..{} (--nnodes {})", options.node_rank,
                                  options.nodes - 1, options.nodes));
  if (options.master_port && (*options.master_port < 1 || *options.master_port > kMaxPort))
    throw ConfigError(fmt::format("ltrain launch: --master-port {}: a TCP port is between 1 and {}; leave the option "
                                  "out for a free one",
                                  *options.master_port, kMaxPort));
  if (options.master_addr && options.master_addr->empty())
    throw ConfigError("ltrain launch: --master-addr needs the address of node 0's machine");
  if (options.nodes > 1 && !(options.master_addr && options.master_port))
    throw ConfigError(fmt::format("ltrain launch --nnodes {}: give every node the same --master-addr (the address of "
                                  "node 0's machine) and --master-port (a free TCP port there)",
                                  options.nodes));
  if (options.processes * options.nodes > kMaxWorldSize)
    throw ConfigError(fmt::format("ltrain launch: {} nodes of {} processes are more than {} processes", options.nodes,
                                  options.processes, kMaxWorldSize));
  if (options.command.empty())
    throw ConfigError("ltrain launch: no command after --; for example: ltrain launch -n 2 -- train --config C.json");
}

namespace {

/// Where this node's ranks stand among all of them, and where they meet.
struct RankPlan {
  int64_t world_size = 0;
  int64_t first_rank = 0;  ///< the global rank of this node's local rank 0
  std::string address;     ///< of node 0's machine, which serves the rendezvous
  int64_t port = 0;
};

RankPlan plan_ranks(const LaunchOptions& options) {
  RankPlan plan;
  plan.world_size = options.processes * options.nodes;
  plan.first_rank = options.node_rank * options.processes;
  plan.address = options.master_addr.value_or("127.0.0.1");
  plan.port = options.master_port ? *options.master_port : free_port();
  return plan;
}

void log_plan(const LaunchOptions& options, const RankPlan& plan) {
  if (options.nodes == 1)
    spdlog::info("launch: {} processes, rendezvous at {}:{}", options.processes, plan.address, plan.port);
  else
    spdlog::info("launch: node {} of {}: ranks {}..{} of {}, rendezvous at {}:{}", options.node_rank, options.nodes,
                 plan.first_rank, plan.first_rank + options.processes - 1, plan.world_size, plan.address, plan.port);
}

/// The variables a rank reads, all set by the launcher (none inherited from its own environment).
constexpr const char* kRankVariables[] = {"RANK",        "LOCAL_RANK",  "WORLD_SIZE",
                                          "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                                          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                                          "TORCHELASTIC_RESTART_COUNT"};

/// This process's environment without kRankVariables, plus torchrun's variables for local rank
/// `local_rank` ("NAME=value").
std::vector<std::string> rank_environment(const LaunchOptions& options, const RankPlan& plan, int64_t local_rank) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool ours = false;
    for (const char* variable : kRankVariables) ours = ours || name == variable;
    if (!ours) environment.push_back(text);
  }
  const std::vector<std::string> torchrun_variables{
      fmt::format("RANK={}", plan.first_rank + local_rank),
      fmt::format("LOCAL_RANK={}", local_rank),
      fmt::format("WORLD_SIZE={}", plan.world_size),
      fmt::format("LOCAL_WORLD_SIZE={}", options.processes),
      fmt::format("GROUP_RANK={}", options.node_rank),
      fmt::format("MASTER_ADDR={}", plan.address),
      fmt::format("MASTER_PORT={}", plan.port),
  };
  environment.insert(environment.end(), torchrun_variables.begin(), torchrun_variables.end());
  return environment;
}

/// What each rank's execve takes. Built before the first fork: between fork and exec a child may
/// only make async-signal-safe calls (no allocation).
struct RankPrograms {
  std::vector<std::string> arguments;                  ///< "ltrain", then the command
  std::vector<std::vector<std::string>> environments;  ///< one per local rank
};

RankPrograms rank_programs(const LaunchOptions& options, const RankPlan& plan) {
  RankPrograms programs;
  programs.arguments.push_back("ltrain");
  programs.arguments.insert(programs.arguments.end(), options.command.begin(), options.command.end());
  for (int64_t local_rank = 0; local_rank < options.processes; ++local_rank)
    programs.environments.push_back(rank_environment(options, plan, local_rank));
  return programs;
}

/// Pointers to `strings`' characters, null-terminated, for execve.
std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

struct Child {
  pid_t pid = -1;
  int64_t rank = 0;  // global
  bool running = false;
  bool stopped = false;  // SIGTERM from the launcher, after another failed
  bool killed = false;   // and SIGKILL after the grace period
};

void signal_running(const std::vector<Child>& children, int signal) {
  for (const Child& child : children)
    if (child.running) ::kill(child.pid, signal);
}

/// Forks a rank that executes this program with `argv` and `envp`, in a process group of its own;
/// its pid, or -1 when fork failed.
pid_t start_rank(char* const* argv, char* const* envp) {
  const pid_t launcher = ::getpid();
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
    ::execve("/proc/self/exe", argv, envp);
    std::_Exit(127);
  }
  sigprocmask(SIG_SETMASK, &launcher_mask, nullptr);
  if (pid > 0) ::setpgid(pid, pid);  // also here, so that no signal finds it in the launcher's group
  return pid;
}

/// Starts this node's ranks. RunError when one cannot be started (those started are killed).
std::vector<Child> start_ranks(RankPrograms& programs, const RankPlan& plan) {
  std::vector<char*> argv = c_strings(programs.arguments);
  std::vector<Child> children;
  for (std::vector<std::string>& environment : programs.environments) {
    const int64_t rank = plan.first_rank + static_cast<int64_t>(children.size());
    const std::vector<char*> envp = c_strings(environment);
    const pid_t pid = start_rank(argv.data(), envp.data());
    if (pid < 0) {
      signal_running(children, SIGKILL);
      throw RunError(fmt::format("ltrain launch: cannot start rank {} (fork failed)", rank));
    }
    children.push_back(Child{pid, rank, true, false, false});
  }
  return children;
}

/// While it lives, the launcher's SIGINT and SIGTERM are counted for RankWatch to pass on; the
/// handlers before it come back after.
class RememberedSignals {
 public:
  RememberedSignals() {
    g_signals_received.store(0);
    struct sigaction action {};
    action.sa_handler = remember_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_interrupt_);
    sigaction(SIGTERM, &action, &old_terminate_);
  }
  ~RememberedSignals() {
    sigaction(SIGINT, &old_interrupt_, nullptr);
    sigaction(SIGTERM, &old_terminate_, nullptr);
  }
  RememberedSignals(const RememberedSignals&) = delete;
  RememberedSignals& operator=(const RememberedSignals&) = delete;

 private:
  struct sigaction old_interrupt_ {};
  struct sigaction old_terminate_ {};
};

/// This node's ranks until the last has ended: each signal the launcher gets is passed on once,
/// and the first rank that fails has the others stopped (SIGTERM, then SIGKILL after the grace
/// period).
class RankWatch {
 public:
  RankWatch(std::vector<Child> children, double grace_seconds)
      : children_(std::move(children)), grace_seconds_(grace_seconds) {}

  /// How the ranks ended, in the order they did, once all have.
  std::vector<ProcessEnd> wait() {
    while (running() > 0) {
      pass_signals_on();
      int status = 0;
      if (const pid_t pid = ::waitpid(-1, &status, WNOHANG); pid > 0) {
        record_end(pid, status);
        continue;
      }
      kill_when_grace_is_over();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ends_;
  }

  /// Whether a signal was passed on: the ranks stopped because the launcher was asked to.
  bool interrupted() const { return signals_passed_on_ > 0; }

 private:
  using Clock = std::chrono::steady_clock;

  size_t running() const {
    return static_cast<size_t>(
        std::count_if(children_.begin(), children_.end(), [](const Child& child) { return child.running; }));
  }

  // Each signal is passed on once: the first asks every process to finish its step and
  // checkpoint, a later one (after the ranks' grace period) to exit at once.
  void pass_signals_on() {
    if (const int received = g_signals_received.load(); received > signals_passed_on_) {
      signals_passed_on_ = received;
      signal_running(children_, g_last_signal.load());
    }
  }

  void record_end(pid_t pid, int status) {
    for (Child& child : children_) {
      if (child.pid != pid) continue;
      child.running = false;
      ProcessEnd end;
      end.rank = child.rank;
      end.stopped = child.stopped;
      end.killed = child.killed;
      if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
      else end.signal = WTERMSIG(status);
      ends_.push_back(end);
      // The first failure stops the others (after a passed-on signal they are stopping already).
      if (failed(end) && !stopping_ && running() > 0 && signals_passed_on_ == 0) stop_the_others();
    }
  }

  void stop_the_others() {
    for (Child& other : children_) other.stopped = other.running;
    signal_running(children_, SIGTERM);
    stopping_ = true;
    kill_at_ = Clock::now() +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds_));
  }

  void kill_when_grace_is_over() {
    if (!kill_at_ || Clock::now() < *kill_at_) return;
    spdlog::error("launch: processes still running {:.0f} s after SIGTERM: killing them", grace_seconds_);
    for (Child& child : children_) child.killed = child.running;
    signal_running(children_, SIGKILL);
    kill_at_.reset();
  }

  std::vector<Child> children_;
  double grace_seconds_;
  std::vector<ProcessEnd> ends_;
  int signals_passed_on_ = 0;
  bool stopping_ = false;                     // SIGTERM sent after a failure
  std::optional<Clock::time_point> kill_at_;  // and SIGKILL due then
};

/// launch_result's exit code, after logging its line.
int decide_exit_code(const std::vector<ProcessEnd>& ends, bool interrupted) {
  const LaunchResult result = launch_result(ends, interrupted);
  if (!result.message.empty()) spdlog::error("{}", result.message);
  return result.exit_code;
}

}  // namespace

int launch(const LaunchOptions& options) {
  check_launch_options(options);
  const RankPlan plan = plan_ranks(options);
  RankPrograms programs = rank_programs(options, plan);
  const RememberedSignals signals;
  log_plan(options, plan);
  RankWatch ranks(start_ranks(programs, plan), options.grace_seconds);
  const std::vector<ProcessEnd> ends = ranks.wait();
  return decide_exit_code(ends, ranks.interrupted());
}

}  // namespace ltrain::dist
