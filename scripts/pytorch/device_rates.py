#!/usr/bin/env python3
"""Two rates of a GPU that bound a training step from below, measured rather than read off a data sheet.

    python3 scripts/pytorch/device_rates.py [--device cuda:0] [--gib 4] [--json OUT]

hbm_tbs: device memory bandwidth, TB/s, from copying one large buffer into another (each byte read
once and written once: 2 x size per copy), the best of 20 timed copies after 3 untimed ones.
kernel_floor_us: the time one small kernel takes inside a CUDA graph (launch, one tiny block, tail),
from replaying a graph of 2,000 in-place additions on a 256-element tensor, each depending on the one
before; the median of 20 replays divided by 2,000.
"""
import argparse
import json
import statistics
import sys

import torch

COPIES = 20
GRAPH_KERNELS = 2000
GRAPH_REPLAYS = 20


def timed(device, fn, repeats):
    """Milliseconds of each of `repeats` calls of fn, timed with CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    return times


def hbm_tbs(device, gib):
    size = int(gib * 2**30)
    source = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    timed(device, lambda: target.copy_(source), 3)
    best_ms = min(timed(device, lambda: target.copy_(source), COPIES))
    return 2 * size / (best_ms * 1e-3) / 1e12


def kernel_floor_us(device):
    x = torch.zeros(256, device=device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm the kernel up outside capture
        x.add_(1)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_KERNELS):
            x.add_(1)
    timed(device, graph.replay, 3)
    return statistics.median(timed(device, graph.replay, GRAPH_REPLAYS)) * 1e3 / GRAPH_KERNELS


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--gib", type=float, default=4.0, help="size of the copied buffer, GiB")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("device_rates: torch sees no CUDA device; run on a GPU host", file=sys.stderr)
        return 3
    device = torch.device(args.device)
    result = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "hbm_tbs": round(hbm_tbs(device, args.gib), 3), "kernel_floor_us": round(kernel_floor_us(device), 3)}
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
