# Writes OUTPUT, a C++ file defining ltrain::source_commit(): `git describe --always --dirty` of
# SOURCE_DIR, or "unknown" where SOURCE_DIR is no git checkout (an archive, a copy without .git) or
# git is missing; and ltrain::source_dir(): SOURCE_DIR. Run with `cmake -P` at configure time and before every build; the file is
# rewritten only when the text changes, so an unchanged commit recompiles nothing.
#
#   cmake -DSOURCE_DIR=... -DOUTPUT=.../source_commit.cpp -P cmake/SourceCommit.cmake

set(commit "unknown")
find_program(LTRAIN_GIT git)
if(LTRAIN_GIT AND EXISTS "${SOURCE_DIR}/.git")
  execute_process(COMMAND "${LTRAIN_GIT}" -C "${SOURCE_DIR}" describe --always --dirty
                  OUTPUT_VARIABLE described OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
  if(NOT failed AND described MATCHES "^[A-Za-z0-9._/+-]+$")
    set(commit "${described}")
  endif()
endif()

string(CONCAT text "// Written by cmake/SourceCommit.cmake; do not edit.\n#include \"ltrain/core/build_info.h\"\n\n"
                   "const char* ltrain::source_commit() { return \"${commit}\"; }\n"
                   "const char* ltrain::source_dir() { return R\"ltrain(${SOURCE_DIR})ltrain\"; }\n")
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
