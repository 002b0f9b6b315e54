# The kernels' micro-benchmarks (scripts/kernels/), CUDA builds only and not part of `all`: each is a
# target of the build it measures, so that it compiles with that build's nvcc, architectures and
# cuDNN, and runs from the build folder:
#   cmake --build BUILD --target ltrain_bench_batch_norm_kernels && BUILD/ltrain_bench_batch_norm_kernels
#   cmake --build BUILD --target ltrain_bench_fused_conv         (-DLTRAIN_FUSED_CONV=ON, a build with cuDNN;
#                                                                  scripts/kernels/bench-fused-conv.sh)
if(LTRAIN_WITH_CUDA)
  # ltrain's BatchNorm kernels alone. The benchmark includes their sources (batch_norm.cu,
  # batch_norm_kernels.cu) to reach the planner and launcher inside them, so it compiles them itself.
  add_executable(ltrain_bench_batch_norm_kernels EXCLUDE_FROM_ALL scripts/kernels/bench_batch_norm_kernels.cu
                                                                  src/kernels/device_limits.cu)
  target_link_libraries(ltrain_bench_batch_norm_kernels PRIVATE ltrain_device_fit CUDA::cudart)
  set_target_properties(ltrain_bench_batch_norm_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                        CUDA_ARCHITECTURES "${LTRAIN_CUDA_ARCHITECTURES}" CUDA_RUNTIME_LIBRARY Shared)
  target_compile_options(ltrain_bench_batch_norm_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--threads=0>)
endif()

if(LTRAIN_FUSED_CONV AND LTRAIN_WITH_CUDNN)
  # ltrain's convolution with BatchNorm statistics against cuDNN's plain convolution, which the cuDNN
  # graphs study (experiments/conv_graph/) times, each followed by ltrain's BatchNorm.
  add_executable(ltrain_bench_fused_conv EXCLUDE_FROM_ALL scripts/kernels/bench_fused_conv.cu
                                                          experiments/conv_graph/conv_graph.cpp)
  target_include_directories(ltrain_bench_fused_conv SYSTEM PRIVATE ${LTRAIN_CUDNN_INCLUDE_DIR})
  target_link_libraries(ltrain_bench_fused_conv PRIVATE ltrain_fused_conv ltrain_kernels ${LTRAIN_CUDNN_LIBRARY})
  get_filename_component(ltrain_cudnn_library_dir "${LTRAIN_CUDNN_LIBRARY}" DIRECTORY)
  # sm_90a by flag, as ltrain_fused_conv (cmake/fused_conv.cmake); the cuDNN found beside torch by RPATH.
  set_target_properties(ltrain_bench_fused_conv PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Shared BUILD_RPATH "${ltrain_cudnn_library_dir}")
  target_compile_options(ltrain_bench_fused_conv PRIVATE
                         $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -Xcompiler=-Wall,-Wextra>)
endif()
