// ltrain, the command a user runs: it blocks SIGINT and SIGTERM, then executes ltrain-core (the
// program itself, in the same folder) in its own place. The dynamic loader then maps LibTorch's few
// hundred shared libraries with both signals held; ltrain-core's first code installs its handlers
// and unblocks them, so a stop signal at any moment gets ltrain's one line and exit code 130 rather
// than the default action's silent 143. The launcher needs no library but the C library, and is
// linked statically where the toolchain allows: no loader runs before its first instruction, which
// on x86-64 already blocks the signals.
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ltrain/core/errors.h"

namespace {

constexpr char kProgramName[] = "ltrain-core";

void block_stop_signals(int /*argc*/, char** /*argv*/, char** /*environment*/) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
}

/// Writes the folder of this executable, symbolic links resolved and ending in '/', to `folder`;
/// false when /proc cannot say.
bool own_folder(char (&folder)[PATH_MAX]) {
  const ssize_t length = ::readlink("/proc/self/exe", folder, sizeof folder - 1);
  if (length <= 0) return false;
  folder[length] = '\0';
  char* last_slash = strrchr(folder, '/');
  if (last_slash == nullptr) return false;
  last_slash[1] = '\0';
  return true;
}

}  // namespace

// Run before the C library's own initializers, the earliest C++ code can run.
__attribute__((section(".preinit_array"), used)) static void (*block_stop_signals_first)(int, char**, char**) =
    block_stop_signals;

#if LTRAIN_LAUNCHER_ENTRY
#if !defined(__x86_64__)
#error "LTRAIN_LAUNCHER_ENTRY is written for x86-64 alone"
#endif
// The executable's entry point (the linker's -e): its first instructions block SIGINT and SIGTERM
// (rt_sigprocmask(SIG_BLOCK, {SIGINT, SIGTERM}, NULL, 8)), then the C library's _start runs as it
// would have. The C library's start-up runs before the pre-initialization array, a window in which
// a signal would still meet the default action. %rdx (a function for atexit, from the loader) is
// kept for _start; the stack is untouched.
__asm__(R"(
  .text
  .globl ltrain_launcher_entry
  .type ltrain_launcher_entry, @function
ltrain_launcher_entry:
  mov %rdx, %r12
  mov $14, %eax
  xor %edi, %edi
  lea ltrain_stop_signal_mask(%rip), %rsi
  xor %edx, %edx
  mov $8, %r10d
  syscall
  mov %r12, %rdx
  jmp _start
  .size ltrain_launcher_entry, .-ltrain_launcher_entry
  .section .rodata
  .align 8
ltrain_stop_signal_mask:
  .quad (1 << (2 - 1)) | (1 << (15 - 1))
  .text
)");
#endif

int main(int argc, char** argv) {
  block_stop_signals(argc, argv, nullptr);  // again (no effect) where a loader skipped the array
  char program[PATH_MAX];
  int error = ENOENT;
  if (own_folder(program) && strlen(program) + sizeof kProgramName <= sizeof program) {
    strcat(program, kProgramName);
    ::execv(program, argv);  // returns only when it failed
    error = errno;
  } else {
    strcpy(program, kProgramName);
  }
  fprintf(stderr, "ltrain: cannot run %s: %s; ltrain and %s belong in one folder (cmake --install puts both "
          "in PREFIX/bin; to run a build's ltrain from elsewhere, link to it with ln -s rather than copy it)\n",
          program, strerror(error), kProgramName);
  return static_cast<int>(ltrain::ExitCode::cannot_start);
}
