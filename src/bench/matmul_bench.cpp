#include "ltrain/bench/matmul_bench.h"

#include "ltrain/bench/step_bench.h"

#include "ltrain/core/gpu.h"
#include "ltrain/core/torch_compat.h"

namespace ltrain::bench {
namespace {

torch::ScalarType operand_type(config::PrecisionMode precision) {
  switch (precision) {
    case config::PrecisionMode::fp16: return torch::kFloat16;
    case config::PrecisionMode::bf16: return torch::kBFloat16;
    default: return torch::kFloat32;
  }
}

MatmulResult run_one(const torch::Device& device, config::PrecisionMode precision, int64_t n, int64_t warmup,
                     int64_t products) {
  MatmulResult result;
  result.precision = config::to_string(precision);
  result.dtype = c10::toString(operand_type(precision));
  result.n = n;
  result.products = products;
  if (precision == config::PrecisionMode::tf32 && !device.is_cuda()) {
    result.error = "TF32 is a feature of NVIDIA GPUs";
    return result;
  }
  compat::set_tf32(/*matmul=*/precision == config::PrecisionMode::tf32, /*convolutions=*/false);
  try {
    torch::NoGradGuard no_grad;
    const auto options = torch::TensorOptions().dtype(operand_type(precision)).device(device);
    const torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
    torch::Tensor c = torch::empty({n, n}, options);
    for (int64_t i = 0; i < warmup; ++i) torch::mm_out(c, a, b);
    const double ms = gpu::elapsed_ms(device, [&] {
      for (int64_t i = 0; i < products; ++i) torch::mm_out(c, a, b);
    });
    result.ms_per_product = ms / static_cast<double>(products);
    result.tflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) *
                    static_cast<double>(products) / (ms * 1e-3) / 1e12;
  } catch (const c10::Error& error) {
    result.error = failure_text(error, device);
  }
  compat::set_tf32(false, false);
  return result;
}

}  // namespace

std::vector<MatmulResult> bench_matmul(const torch::Device& device, const std::vector<config::PrecisionMode>& precisions,
                                       int64_t n, int64_t warmup, int64_t products) {
  std::vector<MatmulResult> results;
  for (const config::PrecisionMode precision : precisions) results.push_back(run_one(device, precision, n, warmup, products));
  return results;
}

nlohmann::json to_json(const MatmulResult& r) {
  nlohmann::json out{{"precision", r.precision}, {"dtype", r.dtype}, {"n", r.n}, {"products", r.products}};
  if (r.error.empty()) {
    out["ms_per_product"] = r.ms_per_product;
    out["tflops"] = r.tflops;
  } else {
    out["error"] = r.error;
  }
  return out;
}

}  // namespace ltrain::bench
