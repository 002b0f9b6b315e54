#!/usr/bin/env python3
"""scripts/report/trace_summary.py's GPU time by kernel family on a made-up Chrome trace: Inductor's
Triton kernels count as Triton even where their names hold "batch_norm" or "convolution_backward",
cuDNN's and CUTLASS's kernels as convolutions, ATen's and ltrain's BatchNorm kernels together,
copies and sets apart, host events not at all; totals are per step.

    python3 tests/trace_summary_test.py      # exit 0 when all hold
"""
import json
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "report", "trace_summary.py")

STEPS = 2
# (category, name, duration in us) over the whole trace, that is over STEPS steps.
EVENTS = [
    ("kernel", "triton_poi_fused__native_batch_norm_legit_functional_convolution_backward_7", 400),
    ("kernel", "triton_red_fused_add_relu_3", 200),
    ("kernel", "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", 300),
    ("kernel", "void cutlass::device_kernel<ltrain::kernels::fused_conv::Sm90ConvWithStatistics>", 100),
    ("kernel", "void at::native::batch_norm_collect_statistics_channels_last_kernel<float>", 120),
    ("kernel", "void ltrain::kernels::batch_norm_detail::forward_kernel<__nv_bfloat16, 4>", 80),
    ("kernel", "void ltrain::kernels::sgd_kernel<float>", 60),
    ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 20),
    ("gpu_memset", "Memset (Device)", 4),
    ("cuda_runtime", "cudaGraphLaunch", 1000),
    ("cpu_op", "aten::batch_norm", 5000),
]
# family -> (count per step, ms per step)
EXPECTED = {
    "Triton (torch.compile's fused kernels)": (1.0, 0.300),
    "convolution and matmul (cuDNN, cuBLAS, CUTLASS)": (1.0, 0.200),
    "BatchNorm (ATen's and ltrain's)": (1.0, 0.100),
    "other kernels": (0.5, 0.030),
    "copies and sets": (1.0, 0.012),
}


def family_rows(output):
    """The by-family table's rows as {family: (count per step, ms per step)}, in printed order."""
    lines = output.splitlines()
    start = lines.index("GPU time by kernel family") + 2  # past the title and the header
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        family, count, ms = line.rstrip().rsplit(None, 2)
        rows[family.strip()] = (float(count), float(ms))
    return rows


def main():
    trace = {"traceEvents": [{"ph": "X", "cat": cat, "name": name, "ts": 10_000 * i, "dur": dur,
                              "pid": 1, "tid": 1} for i, (cat, name, dur) in enumerate(EVENTS)]}
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "trace.json")
        with open(path, "w") as f:
            json.dump(trace, f)
        result = subprocess.run([sys.executable, SCRIPT, path, "--steps", str(STEPS)],
                                capture_output=True, text=True)
    failures = []
    if result.returncode != 0:
        failures.append(f"trace_summary.py exited {result.returncode}: {result.stderr.strip()}")
    else:
        rows = family_rows(result.stdout)
        if rows != EXPECTED:
            failures.append(f"families {rows}, expected {EXPECTED}")
        if list(rows) != sorted(rows, key=lambda family: -rows[family][1]):
            failures.append(f"families not busiest first: {list(rows)}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
