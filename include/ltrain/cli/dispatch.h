#pragma once
// ltrain's commands as a command line reaches them: the command's name looked up in one table
// (what `ltrain --help` lists, what runs, what shell completion offers), its arguments parsed by
// the command's own options, and the library called. The executable's main calls dispatch and
// turns what it throws into exit codes.

namespace ltrain::cli {

/// Runs the command `argv` names (argv[1], with argv[2] for a command of two words such as "bench
/// step") on the arguments after it; returns the exit code. `ltrain --help` and `ltrain --version`
/// print and return 0; no command prints the usage on stderr and returns 2. ConfigError for an
/// unknown command or a bad option or argument; a command's own errors pass through.
int dispatch(int argc, char** argv);

}  // namespace ltrain::cli
