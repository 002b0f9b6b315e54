#!/usr/bin/env python3
"""Side-by-side Markdown table of ltrain's and PyTorch Python's training-step throughput.

    python3 scripts/report/bench_report.py --ltrain OUT/ltrain.jsonl --pytorch OUT/pytorch.json

    python3 scripts/report/bench_report.py --ltrain OUT/ltrain-1.jsonl OUT/ltrain-2.jsonl \
        --pytorch OUT/pytorch-1.json OUT/pytorch-2.json

Rows are matched on (arch, stem, precision, channels_last, checkpoint segments, batch size): each
ltrain row (eager or graphed) is set beside every PyTorch mode measured for it (eager, compile,
graph), one table row each; PyTorch's "fp16 (no scaler)" graph pairs with ltrain's fp16 (whose
graph keeps its GradScaler). With several rounds (file i of each list is round i, run one after the other), the
table shows medians, and the ratio is the median of the per-round ratios (ltrain img/s over
PyTorch img/s of the same round), with their range. "host ms" is the time
ltrain's host took to issue a step: near ms/step, the step is bound by kernel launches.
"""
import argparse
import json
import statistics

GIB = float(1 << 30)


def key(arch, stem, precision, channels_last, segments, mode, batch):
    # PyTorch's hand-captured fp16 graph runs without a scaler and says so in its precision.
    precision = precision.split(" (")[0]
    return (arch, stem, precision, bool(channels_last), int(segments), mode, int(batch))


def with_mode(k, mode):
    return k[:5] + (mode,) + k[6:]


def load_ltrain(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            k = key(r["arch"], r["stem"], r["precision"], r.get("channels_last", False),
                    r.get("checkpoint_segments", 0), r.get("mode", "eager"), r["batch_size"])
            rows[k] = r
    return rows


def load_pytorch(path):
    with open(path) as f:
        doc = json.load(f)
    rows = {}
    for r in doc["rows"]:
        rows[key(r["arch"], r["stem"], r["precision"], r["channels_last"], r.get("checkpoint_segments", 0),
                 r["mode"], r["batch"])] = r
    return doc["header"], rows


def gib(value):
    return "n/a" if value is None or value < 0 else f"{value:.2f}"


def median(values):
    return statistics.median(values) if values else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ltrain", nargs="+", required=True, help="ltrain bench step --json lines, one file per round")
    p.add_argument("--pytorch", nargs="+", required=True, help="bench_pytorch.py JSON, one file per round")
    args = p.parse_args()
    if len(args.ltrain) != len(args.pytorch):
        p.error("give one --ltrain and one --pytorch file per round")
    rounds = [(load_ltrain(ours), load_pytorch(theirs)) for ours, theirs in zip(args.ltrain, args.pytorch)]
    header = rounds[0][1][0]
    print(f"GPU: {header['gpu']}; PyTorch {header['torch']}, CUDA {header['cuda']}, cuDNN {header['cudnn']}; "
          f"date {header['date']}; {len(rounds)} round(s), medians shown"
          + ("; ratio range = lowest-highest per-round ratio" if len(rounds) > 1 else "") + "\n")
    print("| model | precision | channels_last | segments | ltrain mode | PyTorch mode | batch | ltrain img/s "
          "| PyTorch img/s | ratio | ratio range | ltrain ms/step | host ms | PyTorch ms/step | ltrain GiB "
          "| PyTorch GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ours_keys = sorted({k for ours, _ in rounds for k in ours}, key=lambda k: k[2:])
    their_modes = sorted({k[5] for _, (_, theirs) in rounds for k in theirs})
    for k in ours_keys:
        arch, stem, precision, channels_last, segments, mode, batch = k
        ours = [o[k] for o, _ in rounds if k in o]
        our_ips = median([r["images_per_second"] for r in ours])
        host = [r["host_ms_per_step"] for r in ours if "host_ms_per_step" in r]
        host_cell = f"{median(host):.2f}" if host else "n/a"
        our_bytes = max(r["peak_memory_bytes"] for r in ours)
        paired = [m for m in their_modes if any(with_mode(k, m) in t for _, (_, t) in rounds)] or [mode]
        for their_mode in paired:
            tk = with_mode(k, their_mode)
            theirs = [t[tk] for _, (_, t) in rounds if tk in t and not t[tk].get("error")]
            errors = [t[tk]["error"] for _, (_, t) in rounds if tk in t and t[tk].get("error")]
            ratios = [o[k]["images_per_second"] / t[tk]["img_per_s"] for o, (_, t) in rounds
                      if k in o and tk in t and not t[tk].get("error")]
            their_ips = median([r["img_per_s"] for r in theirs])
            their_cell = f"{their_ips:.0f}" if their_ips else (errors[0] if errors else "n/a")
            ratio_cell = f"{median(ratios):.2f}x" if ratios else "n/a"
            range_cell = f"{min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else ""
            their_ms_cell = f"{median([r['ms_per_step'] for r in theirs]):.2f}" if theirs else "n/a"
            their_gib = max((r.get("steady_mem_gib") or -1 for r in theirs), default=-1)
            # e.g. "no scaler", from PyTorch's "fp16 (no scaler)"
            their_note = theirs[0]["precision"][len(precision):].strip(" ()") if theirs else ""
            print(f"| {arch} ({stem} stem) | {precision} | {'on' if channels_last else 'off'} | {segments or 'off'} "
                  f"| {mode} | {their_mode}{f', {their_note}' if their_note else ''} | {batch} "
                  f"| {our_ips:.0f} | {their_cell} | {ratio_cell} | {range_cell} "
                  f"| {median([r['ms_per_step'] for r in ours]):.2f} | {host_cell} | {their_ms_cell} "
                  f"| {gib(our_bytes / GIB if our_bytes >= 0 else None)} | {gib(their_gib)} |")


if __name__ == "__main__":
    main()
