#!/usr/bin/env python3
"""scripts/report/step_timeline.py on a made-up Chrome trace of two steps with two streams: the busy
share, the idle stretches, the share of SMs with a block where kernels overlap (summed, at most
all of them), the overlap, the kernel families' shares of SMs and of time and the busiest stream, the idle
stretches by the families around them; host events count for nothing, and a kernel with neither blocks per SM nor a
grid over a known SM count is refused.

    python3 tests/step_timeline_test.py      # exit 0 when all hold
"""
import json
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "report", "step_timeline.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import step_timeline  # noqa: E402

STEPS = 2
# (category, name, start us, duration us, stream, args beyond the stream)
EVENTS = [
    ("kernel", "sm90_xmma_dgrad_implicit_gemm_f16f16", 0, 100, 7, {"blocks per SM": 0.5}),
    ("kernel", "sm90_xmma_wgrad_implicit_gemm_f16f16", 50, 100, 9, {"blocks per SM": 0.25}),
    ("kernel", "void ltrain::kernels::batch_norm_detail::backward_kernel<__half, 4>", 120, 40, 7, {"blocks per SM": 2.0}),
    ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 200, 20, 7, {}),
    ("kernel", "void ltrain::kernels::sgd_kernel<float>", 300, 60, 7, {"grid": [66, 1, 1]}),
    ("kernel", "void at::native::reduce_kernel<512, 1>", 360, 40, 7, {"grid": [132, 1, 1]}),
    ("cuda_runtime", "cudaGraphLaunch", 0, 1000, 0, {}),
]
EXPECTED = {
    "kernels": 2.5,
    "step_ms": 0.2,            # 400 us over 2 steps
    "busy": 0.7,               # [0,160] + [200,220] + [300,400] of 400
    "gaps_ms": 0.06,           # 40 + 80 us over 2 steps
    "gaps": 1.0,
    "sm_share": 177.5 / 260,   # 25 + 37.5 + 5 + 30 (1.25 counts as 1) + 10 + 30 + 40 over 260 us of kernels
    "sm_share_conv": 0.375,    # (0.5 * 100 + 0.25 * 100) / 200
    "sm_share_batch_norm": 1.0,
    "time_conv": 200 / 340,    # of the kernels' summed time, 340 us
    "time_batch_norm": 40 / 340,
    "time_optimizer": 60 / 340,  # the reduction is none of the three
    "overlap": 0.2,            # [50,100] and [120,150] of 400
    "streams": 2,
    "critical_ms": 0.12,       # stream 7: 240 us over 2 steps
}
# [160, 200] after the BatchNorm kernel (it ends last, at 160) before the copy; [220, 300] after the
# copy before the SGD kernel; a step holds half of each.
EXPECTED_GAPS_BETWEEN = {"copy > optimizer": {"us": 40.0, "stretches": 0.5},
                         "BatchNorm > copy": {"us": 20.0, "stretches": 0.5}}


def write_trace(directory, events):
    path = os.path.join(directory, "trace.json")
    trace = [{"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
              "args": dict(args, stream=stream)} for cat, name, ts, dur, stream, args in events]
    with open(path, "w") as f:
        json.dump({"traceEvents": trace}, f)
    return path


def main():
    problems = []
    with tempfile.TemporaryDirectory() as work:
        path = write_trace(work, EVENTS)
        row = step_timeline.summarize(step_timeline.load_gpu_events(path), STEPS, sms=132)
        for key, value in EXPECTED.items():
            if abs(row[key] - value) > 1e-9:
                problems.append(f"{key} = {row[key]!r}, expected {value!r}")
        if row["gaps_between"] != EXPECTED_GAPS_BETWEEN or list(row["gaps_between"]) != list(EXPECTED_GAPS_BETWEEN):
            problems.append(f"gaps_between = {row['gaps_between']!r}, expected {EXPECTED_GAPS_BETWEEN!r}, longest first")
        out = os.path.join(work, "row.json")
        done = subprocess.run([sys.executable, SCRIPT, path, "--steps", str(STEPS), "--sms", "132", "--json", out],
                              capture_output=True, text=True)
        if done.returncode != 0 or "| trace | kernels |" not in done.stdout or "| trace | 2 | 0.200 | 70% |" not in done.stdout:
            problems.append(f"the command printed {done.stdout!r} {done.stderr!r}, exit {done.returncode}")
        elif json.load(open(out))["trace"]["streams"] != 2:
            problems.append(f"--json wrote {open(out).read()!r}")
        done = subprocess.run([sys.executable, SCRIPT, path, "--steps", str(STEPS), "--sms", "132", "--gaps"],
                              capture_output=True, text=True)
        if done.returncode != 0 or "| trace | copy > optimizer | 40.0 | 0.5 |" not in done.stdout:
            problems.append(f"--gaps printed {done.stdout!r} {done.stderr!r}, exit {done.returncode}")
        done = subprocess.run([sys.executable, SCRIPT, path, "--steps", str(STEPS)], capture_output=True, text=True)
        if done.returncode != 3 or "pass --sms" not in done.stderr:
            problems.append(f"without --sms the grid-only kernel gave exit {done.returncode}: {done.stderr!r}")
    for problem in problems:
        print(f"step_timeline_test: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
