// One CUTLASS configuration of the convolution with statistics (conv_statistics.cuh): bf16,
// ConvStatisticsKernel, tile 256x64x64, 2 stages.
#define LTRAIN_FUSED_CONV_INSTANTIATE_CONV
#include "../conv_statistics.cuh"

LTRAIN_FUSED_CONV_INSTANCE(ConvStatisticsKernel, ElementType::bfloat16, cutlass::bfloat16_t,
                           FusedConvConfig::conv_256x64x64, 256, 64, 2)
