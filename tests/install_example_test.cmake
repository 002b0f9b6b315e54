# Installs ltrain's build into a fresh prefix, builds examples/train-from-cpp against it as a project
# of its own would (find_package(ltrain), ltrain::ltrain), runs it for one epoch on synthetic data and
# checks what it printed and wrote. tests/CMakeLists.txt runs it as
#
#   cmake -DBUILD_DIR=build -DEXAMPLE_DIR=examples/train-from-cpp -DWORK_DIR=DIR -DLIBDIR=lib
#         -DGENERATOR=Ninja -DMAKE_PROGRAM=ninja -DCXX_COMPILER=c++ [-DCXX_COMPILER_LAUNCHER=ccache]
#         [-DPREFIX_PATH=the build's CMAKE_PREFIX_PATH] [-DCUDA_COMPILER=nvcc] -P install_example_test.cmake
#
# WORK_DIR is emptied first and removed when every check passes.
cmake_minimum_required(VERSION 3.19)  # string(JSON)

# run(NAME COMMAND...): runs the command; fails the test with its output unless it exits 0. Its
# standard output is left in `output`.
function(run name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${name} failed (${code}): ${ARGN}\n${out}\n${err}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

function(expect condition_text)
  if(NOT (${ARGN}))
    message(FATAL_ERROR "expected ${condition_text}")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# ---- The install ---------------------------------------------------------------------------------
run("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(file IN ITEMS "${LIBDIR}/cmake/ltrain/ltrainConfig.cmake" "${LIBDIR}/cmake/ltrain/ltrainConfigVersion.cmake"
                      "${LIBDIR}/cmake/ltrain/ltrainTargets.cmake" "${LIBDIR}/libltrain.a" "bin/ltrain" "bin/ltrain-core"
                      "include/ltrain/engine/trainer.h" "include/ltrain/config/load.h")
  expect("${prefix}/${file} to be installed" EXISTS "${prefix}/${file}")
endforeach()
# The public headers are include/ltrain/'s, but for the CUDA kernels' launch interfaces and the
# operators' bridge to them, which need the CUDA toolkit's headers.
get_filename_component(source_dir "${EXAMPLE_DIR}/../.." ABSOLUTE)
file(GLOB_RECURSE public RELATIVE "${source_dir}/include" "${source_dir}/include/ltrain/*.h")
list(FILTER public EXCLUDE REGEX "^ltrain/kernels/|^ltrain/ops/kernel_bridge\\.h$")
list(SORT public)
file(GLOB_RECURSE headers RELATIVE "${prefix}/include" "${prefix}/include/ltrain/*.h")
list(SORT headers)
expect("the installed headers to be the public ones; installed: ${headers}; public: ${public}" headers STREQUAL public)
# Every header an installed header includes is installed too.
foreach(header IN LISTS headers)
  file(STRINGS "${prefix}/include/${header}" includes REGEX "^#include \"ltrain/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
    expect("${included}, which ${header} includes, to be installed" EXISTS "${prefix}/include/${included}")
  endforeach()
endforeach()
# The installed launcher runs the installed ltrain-core, which finds its libraries (LibTorch outside
# the system's folders, by its RPATH).
run("the installed ltrain" "${prefix}/bin/ltrain" --version)
expect("ltrain --version to print the project's version, got: ${output}" output MATCHES "^ltrain [0-9]+\\.[0-9]+\\.[0-9]+ ")
# A launcher copied away from its ltrain-core: one line and exit code 127 (the pattern's "." stands for
# the message's semicolon, which would split expect()'s arguments).
file(COPY "${prefix}/bin/ltrain" DESTINATION "${WORK_DIR}/alone")
execute_process(COMMAND "${WORK_DIR}/alone/ltrain" --version RESULT_VARIABLE code OUTPUT_VARIABLE output ERROR_VARIABLE err)
expect("a launcher alone to exit 127, got ${code}" code EQUAL 127)
expect("a launcher alone to say what is missing, got: ${err}"
       err MATCHES "^ltrain: cannot run [^\n]*/alone/ltrain-core: No such file or directory. ltrain and ltrain-core belong in one folder[^\n]*\n$")

# ---- The example, a project of its own against the installed package -----------------------------
# The prefix path, a list, goes in through an initial cache file: as an argument, run()'s list of
# arguments would split it.
file(WRITE "${WORK_DIR}/initial-cache.cmake" "set(CMAKE_PREFIX_PATH \"${prefix};${PREFIX_PATH}\" CACHE STRING \"\")\n")
set(configure_args -S "${EXAMPLE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
                   "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" -C "${WORK_DIR}/initial-cache.cmake")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_COMPILER_LAUNCHER}")
endif()
if(CUDA_COMPILER)  # a CUDA LibTorch's CMake files look for the toolkit: the one ltrain was built with
  get_filename_component(cuda_root "${CUDA_COMPILER}" DIRECTORY)
  get_filename_component(cuda_root "${cuda_root}" DIRECTORY)
  # CUDAToolkit_ROOT for CMake's FindCUDAToolkit, CUDA_TOOLKIT_ROOT_DIR for the older FindCUDA that
  # torch's files still run, which otherwise takes the first nvcc on the PATH.
  list(APPEND configure_args "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}" "-DCUDAToolkit_ROOT=${cuda_root}"
                             "-DCUDA_TOOLKIT_ROOT_DIR=${cuda_root}")
endif()
run("configuring the example" "${CMAKE_COMMAND}" ${configure_args})
run("building the example" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")

# One epoch of 256 images in batches of 64: 4 steps; the arguments override the example's config.
set(runs "${WORK_DIR}/runs")
run("the example" "${WORK_DIR}/build/train_from_cpp" "run.out_dir=${runs}" optim.lr=0.05)
set(run_dir "${runs}/train-from-cpp")
string(FIND "${output}" "run ${run_dir}: 1 epoch(s), 4 steps, test accuracy " report_at)
string(REGEX MATCH "test accuracy ([0-9.e+-]+)\n$" accuracy_text "${output}")
set(accuracy "${CMAKE_MATCH_1}")
expect("the example to report its run, 1 epoch, 4 steps and an accuracy in [0, 1]; got: ${output}"
       report_at EQUAL 0 AND accuracy_text AND accuracy GREATER_EQUAL 0 AND accuracy LESS_EQUAL 1)
expect("${run_dir}/summary.json to exist" EXISTS "${run_dir}/summary.json")
file(READ "${run_dir}/summary.json" summary)
string(JSON epochs GET "${summary}" epochs)
string(JSON steps GET "${summary}" steps)
string(JSON summary_run_dir GET "${summary}" run_dir)
expect("summary.json's epochs 1, steps 4, run_dir ${run_dir}; got ${epochs}, ${steps}, ${summary_run_dir}"
       epochs EQUAL 1 AND steps EQUAL 4 AND summary_run_dir STREQUAL run_dir)
file(READ "${run_dir}/config.json" config)
string(JSON source GET "${config}" data source)
string(JSON lr GET "${config}" optim lr)
expect("config.json's data.source synthetic and optim.lr 0.05; got ${source}, ${lr}"
       source STREQUAL "synthetic" AND lr EQUAL 0.05)


# A config file instead of the example's own: 128 images in batches of 64, 2 steps.
file(WRITE "${WORK_DIR}/tiny.json" [=[{
  "run": {"name": "from-file", "epochs": 1},
  "model": {"arch": "resnet18", "stem": "cifar", "width": 8},
  "data": {"source": "synthetic", "synthetic_train_size": 128, "synthetic_test_size": 64, "batch_size": 64}
}]=])
run("the example with a config file" "${WORK_DIR}/build/train_from_cpp" "${WORK_DIR}/tiny.json" "run.out_dir=${runs}")
file(READ "${runs}/from-file/summary.json" summary)
string(JSON steps GET "${summary}" steps)
expect("2 steps from tiny.json, got ${steps}" steps EQUAL 2)

# A key the config does not have: the library's ConfigError, exit code 2, nothing trained.
execute_process(COMMAND "${WORK_DIR}/build/train_from_cpp" "run.out_dir=${runs}" optim.no_such_key=1
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
expect("exit code 2 and one line naming optim.no_such_key; got ${code}: ${err}"
       code EQUAL 2 AND err MATCHES "^train_from_cpp: [^\n]*optim\.no_such_key[^\n]*\n$")

file(REMOVE_RECURSE "${WORK_DIR}")
