#pragma once
// The 4090 guide's matmul test: square n x n products on random data, warm-up products first, then
// timed ones (CUDA events on a GPU); TFLOP/s = 2 n^3 products / time.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ltrain/config/config.h"

namespace ltrain::bench {

struct MatmulResult {
  std::string precision;  ///< fp32 | tf32 | fp16 | bf16
  std::string dtype;      ///< the operands' dtype
  int64_t n = 0;
  int64_t products = 0;   ///< timed products
  double ms_per_product = 0.0;
  double tflops = 0.0;
  std::string error;      ///< why this precision could not run here ("" when it ran)
};

/// One row per precision, in order. A precision the device cannot run becomes a row with `error`.
std::vector<MatmulResult> bench_matmul(const torch::Device& device, const std::vector<config::PrecisionMode>& precisions,
                                       int64_t n, int64_t warmup, int64_t products);

nlohmann::json to_json(const MatmulResult& result);

}  // namespace ltrain::bench
