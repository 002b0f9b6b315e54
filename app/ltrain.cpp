// ltrain-core, the program that the ltrain launcher (app/launcher.cpp) runs: the library's dispatcher
// runs the command; main maps what it throws to exit codes.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include <spdlog/spdlog.h>

#include "ltrain/cli/dispatch.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/interrupt.h"
#include "ltrain/core/log.h"
#include "ltrain/core/torch_compat.h"

namespace {

/// SIGINT/SIGTERM end ltrain with one line and exit code 130 (a training run checkpoints first),
/// never with the default action's silent 143. A signal that came while the launcher held them
/// blocked is delivered at the unblocking. SIGPIPE is ignored: a write to a pipe whose reader is
/// gone (`ltrain train --json | head -1`) fails with EPIPE, which ltrain reports with exit code 4
/// (a training run checkpoints first), instead of ending silently with 141.
void take_stop_signals(int /*argc*/, char** /*argv*/, char** /*environment*/) {
  ::signal(SIGPIPE, SIG_IGN);
  ltrain::interrupt::install_stop_handlers();
  ltrain::interrupt::unblock_stop_signals();
}

/// What a command printed must reach standard output: a schema cut short by a full disk, or lost
/// to a closed stdout, ends with exit code 4 and one line, not with 0.
int checked_output(int code) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error_number = errno;
  // The JSON console's lines were written as they were logged; one that failed is kept there.
  if (const auto console = ltrain::log::console_failure()) {
    spdlog::error("{}: free disk space or send the output elsewhere", console->what());
    return code == 0 ? static_cast<int>(ltrain::ExitCode::runtime) : code;
  }
  if (flushed && !std::ferror(stdout) && !std::cout.fail()) return code;
  spdlog::error("cannot write to standard output ({}): free disk space or send the output elsewhere",
                error_number != 0 ? std::strerror(error_number) : "a write failed");
  return code == 0 ? static_cast<int>(ltrain::ExitCode::runtime) : code;
}

}  // namespace

// Run by the dynamic loader before any shared library's initializers: LibTorch's take a few hundred
// milliseconds, and a signal then would otherwise meet the default action.
__attribute__((section(".preinit_array"), used)) static void (*take_stop_signals_early)(int, char**, char**) =
    take_stop_signals;

int main(int argc, char** argv) {
  take_stop_signals(argc, argv, nullptr);  // again (no effect) where a loader skipped the array
  ltrain::log::init_console(false);
  try {
    return checked_output(ltrain::cli::dispatch(argc, argv));
  } catch (const ltrain::UserError& error) {
    // One problem per line (a config's checks report them all at once), each a line of its own.
    std::istringstream problems(error.what());
    for (std::string line; std::getline(problems, line);) spdlog::error("{}", line);
    return static_cast<int>(error.code());
  } catch (const c10::Error& error) {
    if (ltrain::compat::is_out_of_memory(error)) {
      spdlog::error("out of memory ({}): lower data.batch_size or use a smaller model.arch",
                    ltrain::compat::first_line(error.what_without_backtrace()));
      return static_cast<int>(ltrain::ExitCode::runtime);
    }
    spdlog::error("internal error in LibTorch: {}", error.what_without_backtrace());
    return static_cast<int>(ltrain::ExitCode::internal);
  } catch (const std::exception& error) {
    spdlog::error("internal error: {}", error.what());
    return static_cast<int>(ltrain::ExitCode::internal);
  }
}
