#!/usr/bin/env python3
"""scripts/report/step_model.py's --fused-forward on a made-up per-layer table: rows are read as
bench-fused-conv.sh prints them (the stem's 8 padded input channels, cells of -1.0, other lines
around the table), each forward convolution is charged its measured time only where that is longer
than its bound, and a table that lacks a layer is refused with the layer's name.

    python3 tests/step_model_test.py      # exit 0 when all hold
"""
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "report", "step_model.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import step_model  # noqa: E402

RATES = {"flops": 700e12, "bytes": 4e12, "floor": 1e-6}
BATCH = 64


def table(rows):
    """The benchmark's table, with a header, its rule and a summary line around the rows."""
    lines = ["H200, cuDNN 91900, bf16, ResNet-50 cifar stem, 32x32 images, batch 64",
             "| conv (C->K, k/s, side) | n | cuDNN | fused + stats | fused / cuDNN | conv 256x64x64 |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {c_in}->{c_out}, {k}/{stride}, {side} | 1 | 10.0 | {us:.1f} | 1.00 | -1.0 |"
              for (c_in, c_out, k, stride, side), us in rows]
    lines.append("sum over the network (24 distinct layers), us: cuDNN 2981, fused + stats 5000 (1.68x)")
    return "\n".join(lines) + "\n"


def bench_key(conv):
    c_in, c_out, k, stride, side = conv
    return (8 if c_in == 3 else c_in, c_out, k, stride, side)


def main():
    failures = []
    layers = step_model.resnet50_layers(BATCH, "cifar", 32)
    convolutions = [layer for layer in layers if layer.conv is not None]
    distinct = list(dict.fromkeys(layer.conv for layer in convolutions))
    bounds = {layer.conv: step_model.kernel_seconds(layer.forward_flops, layer.forward_bytes, 1, RATES)
              for layer in convolutions}
    # Every other layer 5 us over its bound, the rest 1 us under it: only the first count.
    over = {conv: index % 2 == 0 for index, conv in enumerate(distinct)}
    rows = [(bench_key(conv), (bounds[conv] + (5e-6 if over[conv] else -1e-6)) * 1e6) for conv in distinct]
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "pairs.txt")
        with open(path, "w") as f:
            f.write(table(rows))
        times = step_model.read_fused_forward(path)
        if set(times) != set(distinct):
            failures.append(f"read {len(times)} layers of {len(distinct)}: {sorted(set(distinct) ^ set(times))}")
        excess, missing = step_model.measured_forward_excess(layers, times, RATES)
        # Each layer counts as often as the network has it; the rows round to 0.1 us.
        expected = sum(5e-6 for layer in convolutions if over[layer.conv])
        if missing or abs(excess - expected) > 0.1e-6 * len(convolutions):
            failures.append(f"excess {excess * 1e6:.2f} us, expected {expected * 1e6:.2f}; missing {missing}")

        # Without the 3x3 64->64 row: step_model names the layers and exits non-zero.
        with open(path, "w") as f:
            f.write(table([row for row in rows if row[0] != (64, 64, 3, 1, 32)]))
        run = subprocess.run([sys.executable, SCRIPT, "--batch", str(BATCH), "--stem", "cifar", "--bandwidth-tbs", "4",
                              "--matmul-tflops", "700", "--fused-forward", path],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
        if run.returncode == 0 or "layer1.0.conv2" not in run.stderr:
            failures.append(f"a table without 64->64 3x3: exit {run.returncode}, stderr {run.stderr.strip()!r}")

    for failure in failures:
        print("FAIL:", failure)
    print("ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
