#!/usr/bin/env python3
"""Table of ltrain's whole-step CUDA graph beside ltrain eager and PyTorch Python's eager,
torch.compile(mode="reduce-overhead") and hand-captured whole-step graph, per precision and batch.

    python3 scripts/report/graph_report.py --ltrain OUT/ltrain-1.jsonl \
        --pytorch OUT/pytorch-1.json [OUT/pytorch-compile.json]

--ltrain: `ltrain bench step --json` lines (graph and eager rows); --pytorch: bench_pytorch.py JSON
files of the same run (rows of several files are merged; a later file wins). "best Python" is the
fastest of the three Python modes; PyTorch's graph runs fp16 without a GradScaler (not capturable
there), ltrain's with one. Achieved TFLOP/s counts GFLOP_PER_IMAGE per image and training step,
beside the bf16 matmul rate that bench_pytorch.py --matmul measured in the same run.
"""
import argparse
import json

from bench_report import GIB, load_ltrain

# ResNet-50 (imagenet stem) at 32x32: 0.168 GFLOP forward per image; a training step is about 3x.
GFLOP_PER_IMAGE = 0.50
PY_MODES = ("eager", "compile", "graph")


def load_pytorch_rows(paths):
    rows, matmul = {}, {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc.get("rows", []):
            precision = r["precision"].replace(" (no scaler)", "")
            rows[(r["arch"], precision, bool(r["channels_last"]), r["mode"], int(r["batch"]))] = r
        for m in doc.get("matmul") or []:
            if not m.get("error"):
                matmul[m["precision"]] = m["tflops"]
        header = doc["header"]
    return header, rows, matmul


def cell(value, spec="{:.0f}"):
    return "n/a" if value is None else spec.format(value)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ltrain", required=True)
    p.add_argument("--pytorch", nargs="+", required=True)
    args = p.parse_args()
    ours = load_ltrain(args.ltrain)
    header, theirs, matmul = load_pytorch_rows(args.pytorch)
    bf16_rate = matmul.get("bf16")
    print(f"GPU: {header['gpu']}; PyTorch {header['torch']}, CUDA {header['cuda']}, cuDNN {header['cudnn']}; "
          f"date {header['date']}" + (f"; bf16 matmul (n=8192) {bf16_rate:.0f} TFLOP/s" if bf16_rate else "") + "\n")
    print("| precision | batch | ltrain graph img/s | ltrain eager | PyTorch eager | PyTorch compile "
          "| PyTorch graph | graph / best Python | graph / Python eager | ltrain graph TFLOP/s | of bf16 matmul "
          "| GiB reserved: ltrain graph | PyTorch graph |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    graph_keys = sorted((k for k, r in ours.items() if k[5] == "graph"), key=lambda k: (k[2], k[6]))
    for k in graph_keys:
        arch, stem, precision, channels_last, segments, _, batch = k
        graph = ours[k]["images_per_second"]
        eager_row = ours.get(k[:5] + ("eager", batch))
        python, python_graph_reserved = {}, None
        for mode in PY_MODES:
            r = theirs.get((arch, precision, channels_last, mode, batch))
            python[mode] = r["img_per_s"] if r and not r.get("error") else None
            if mode == "graph" and python[mode]:
                python_graph_reserved = r.get("steady_reserved_gib")
        measured = [v for v in python.values() if v]
        best = max(measured) if measured else None
        tflops = GFLOP_PER_IMAGE * graph / 1e3
        reserved = ours[k].get("peak_reserved_bytes", -1)
        print(f"| {precision}{' + scaler' if precision == 'fp16' else ''} | {batch} | {graph:.0f} "
              f"| {cell(eager_row['images_per_second'] if eager_row else None)} "
              f"| {cell(python['eager'])} | {cell(python['compile'])} | {cell(python['graph'])} "
              f"| {cell(graph / best if best else None, '{:.2f}x')} "
              f"| {cell(graph / python['eager'] if python['eager'] else None, '{:.1f}x')} "
              f"| {tflops:.0f} | {cell(100 * tflops / bf16_rate if bf16_rate else None, '{:.0f}%')} "
              f"| {cell(reserved / GIB if reserved >= 0 else None, '{:.2f}')} "
              f"| {cell(python_graph_reserved, '{:.2f}')} |")


if __name__ == "__main__":
    main()
