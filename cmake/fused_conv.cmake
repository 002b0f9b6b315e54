# ltrain's convolutions with BatchNorm statistics on CUTLASS (kernels/fused_conv.h): off by default,
# a CUDA build only. The kernels use Hopper's wgmma and TMA and are built for sm_90a alone (whatever
# CMAKE_CUDA_ARCHITECTURES says for the rest of ltrain's kernels); each CUTLASS configuration is a
# file of its own under src/kernels/fused_conv/instances/ (minutes of nvcc each).
#
# CUTLASS is a header-only dependency: the headers of PyPI's nvidia-cutlass wheel that
# scripts/requirements-fused-conv.txt pins, installed into .venv/ without its Python packages
# (`.venv/bin/python3 -m pip install --no-deps -r scripts/requirements-fused-conv.txt`; CI does so and
# compiles ltrain_fused_conv), found through the project's Python; or LTRAIN_CUTLASS_DIR, a CUTLASS
# source tree (include/ and tools/util/include/).
#
# Defines the library ltrain_fused_conv, which ltrain links (ops/fused_conv.h, model.fused_conv),
# and, for the tests, LTRAIN_FUSED_CONV_SOURCES.
option(LTRAIN_FUSED_CONV "Build ltrain's CUTLASS convolutions with BatchNorm statistics (sm_90a) and their GPU test" OFF)
set(LTRAIN_CUTLASS_DIR "" CACHE PATH
    "A CUTLASS source tree (include/, tools/util/include/) for LTRAIN_FUSED_CONV; empty: the nvidia-cutlass wheel in .venv/")

if(LTRAIN_FUSED_CONV)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "ltrain: LTRAIN_FUSED_CONV needs a CUDA build (a LibTorch with CUDA and nvcc)")
  endif()
  if(LTRAIN_CUTLASS_DIR)
    set(ltrain_cutlass_source "${LTRAIN_CUTLASS_DIR}")
  else()
    set(ltrain_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    if(NOT EXISTS "${ltrain_python}")
      set(ltrain_python python3)
    endif()
    execute_process(
      COMMAND "${ltrain_python}" -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
      OUTPUT_VARIABLE ltrain_cutlass_source OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(NOT EXISTS "${ltrain_cutlass_source}/include/cutlass/cutlass.h")
    message(FATAL_ERROR "ltrain: LTRAIN_FUSED_CONV needs CUTLASS's headers: .venv/bin/python3 -m pip install "
                        "--no-deps -r scripts/requirements-fused-conv.txt (scripts/python-env.sh makes .venv/) or set "
                        "LTRAIN_CUTLASS_DIR to a CUTLASS source tree (found: '${ltrain_cutlass_source}')")
  endif()
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-code OUTPUT_VARIABLE ltrain_nvcc_codes ERROR_QUIET)
  # The list names sm_90, not its arch-specific sm_90a, which every nvcc that builds sm_90 (12.0 on) has.
  if(NOT ltrain_nvcc_codes MATCHES "sm_90")
    message(FATAL_ERROR "ltrain: LTRAIN_FUSED_CONV needs an nvcc that builds sm_90a (CUDA 12.0 or later)")
  endif()
  message(STATUS "ltrain: fused convolutions for sm_90a on CUTLASS from ${ltrain_cutlass_source}")

  file(GLOB LTRAIN_FUSED_CONV_INSTANCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/kernels/fused_conv/instances/*.cu")
  set(LTRAIN_FUSED_CONV_SOURCES "${PROJECT_SOURCE_DIR}/src/kernels/fused_conv/fused_conv.cu" ${LTRAIN_FUSED_CONV_INSTANCES})
  add_library(ltrain_fused_conv STATIC ${LTRAIN_FUSED_CONV_SOURCES})
  target_include_directories(ltrain_fused_conv PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
  target_include_directories(ltrain_fused_conv SYSTEM PRIVATE "${ltrain_cutlass_source}/include"
                                                              "${ltrain_cutlass_source}/tools/util/include")
  if(NOT TARGET CUDA::cudart)
    find_package(CUDAToolkit REQUIRED)
  endif()
  target_link_libraries(ltrain_fused_conv PUBLIC CUDA::cudart)
  # sm_90a by flag rather than CUDA_ARCHITECTURES, which older CMake versions read as numbers alone.
  set_target_properties(ltrain_fused_conv PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17
                                                     CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Shared
                                                     POSITION_INDEPENDENT_CODE ON)
  # NDEBUG: CUTLASS's device asserts become calls that serialize the wgmma pipeline (ptxas C7510).
  target_compile_definitions(ltrain_fused_conv PRIVATE NDEBUG)
  target_compile_options(ltrain_fused_conv PRIVATE
                         $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
                         -Xcompiler=-Wall,-Wextra>)
  if(LTRAIN_WERROR)
    target_compile_options(ltrain_fused_conv PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings>)
  endif()
endif()
