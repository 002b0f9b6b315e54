#!/usr/bin/env python3
"""Side-by-side Markdown table of ltrain's and PyTorch Python's training-step throughput.

    python3 scripts/bench_report.py --ltrain OUT/ltrain.jsonl --pytorch OUT/pytorch.json

Rows are matched on (arch, stem, precision, channels_last, checkpoint segments, mode, batch size);
the ratio column is ltrain img/s over PyTorch img/s measured in the same call. "host ms" is the time
ltrain's host took to issue a step: near ms/step, the step is bound by kernel launches.
"""
import argparse
import json

GIB = float(1 << 30)


def key(arch, stem, precision, channels_last, segments, mode, batch):
    return (arch, stem, precision, bool(channels_last), int(segments), mode, int(batch))


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ltrain", required=True)
    p.add_argument("--pytorch", required=True)
    args = p.parse_args()
    ours = load_ltrain(args.ltrain)
    header, theirs = load_pytorch(args.pytorch)
    print(f"GPU: {header['gpu']}; PyTorch {header['torch']}, CUDA {header['cuda']}, cuDNN {header['cudnn']}; "
          f"date {header['date']}\n")
    print("| model | precision | channels_last | segments | mode | batch | ltrain img/s | PyTorch img/s | ratio "
          "| ltrain ms/step | host ms | PyTorch ms/step | ltrain GiB | PyTorch GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(ours, key=lambda k: k[2:]):
        r = ours[k]
        t = theirs.get(k)
        arch, stem, precision, channels_last, segments, mode, batch = k
        t_ips = t["img_per_s"] if t and not t.get("error") else None
        ratio = f"{r['images_per_second'] / t_ips:.2f}x" if t_ips else "n/a"
        ours_gib = r["peak_memory_bytes"] / GIB if r.get("peak_memory_bytes", -1) >= 0 else None
        host_ms = f"{r['host_ms_per_step']:.2f}" if "host_ms_per_step" in r else "n/a"
        print(f"| {arch} ({stem} stem) | {precision} | {'on' if channels_last else 'off'} | {segments or 'off'} "
              f"| {mode} | {batch} "
              f"| {r['images_per_second']:.0f} | {t_ips if t_ips else (t or {}).get('error', 'n/a')} | {ratio} "
              f"| {r['ms_per_step']:.2f} | {host_ms} | {t['ms_per_step'] if t_ips else 'n/a'} "
              f"| {gib(ours_gib)} | {gib(t.get('steady_mem_gib') if t_ips else None)} |")


if __name__ == "__main__":
    main()
