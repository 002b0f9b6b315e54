// The floating-point element types ltrain's own CUDA kernels read and write. Plain C++ (no CUDA
// or LibTorch headers): the LibTorch-side wrappers map torch's dtypes onto it.
#pragma once

namespace ltrain::kernels {

enum class ElementType { float32, float16, bfloat16 };

}  // namespace ltrain::kernels
