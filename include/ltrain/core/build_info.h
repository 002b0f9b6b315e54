#pragma once
// What this build of ltrain was made from, for the provenance of its results.

namespace ltrain {

/// `git describe --always --dirty` of the source tree when the build last ran ("8dfb743",
/// "8dfb743-dirty", "v0.2-3-g8dfb743"), or "unknown" when it was not built from a git checkout.
/// Refreshed before every build (cmake/SourceCommit.cmake), so a rebuild after a commit names it.
const char* source_commit();

/// The source folder the build was made from (absolute), where relative defaults such as
/// data.root's are looked for when the working directory lacks them.
const char* source_dir();

}  // namespace ltrain
