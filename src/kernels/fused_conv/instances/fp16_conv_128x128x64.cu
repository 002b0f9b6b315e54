// One CUTLASS configuration of the convolution with statistics (conv_statistics.cuh): fp16,
// ConvStatisticsKernel, tile 128x128x64, 3 stages.
#define LTRAIN_FUSED_CONV_INSTANTIATE_CONV
#include "../conv_statistics.cuh"

LTRAIN_FUSED_CONV_INSTANCE(ConvStatisticsKernel, ElementType::float16, cutlass::half_t,
                           FusedConvConfig::conv_128x128x64, 128, 128, 3)
