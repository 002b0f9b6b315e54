// Preloaded into ltrain (LD_PRELOAD) by Signals.SigtermBeforeMainEndsWithOneLineAndExitCode130: its
// initializer runs with the shared libraries' (LibTorch's among them), before main, and sends the
// process SIGTERM there.
#include <csignal>

namespace {
__attribute__((constructor)) void raise_sigterm() { std::raise(SIGTERM); }
}  // namespace
