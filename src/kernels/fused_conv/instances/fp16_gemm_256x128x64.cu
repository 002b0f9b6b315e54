// One CUTLASS configuration of the convolution with statistics (conv_statistics.cuh): fp16,
// GemmStatisticsKernel, tile 256x128x64, 3 stages.
#define LTRAIN_FUSED_CONV_INSTANTIATE_GEMM
#include "../conv_statistics.cuh"

LTRAIN_FUSED_CONV_INSTANCE(GemmStatisticsKernel, ElementType::float16, cutlass::half_t,
                           FusedConvConfig::gemm_256x128x64, 256, 128, 3)
