#!/usr/bin/env python3
"""Where a training step's time goes, from a Chrome trace of LibTorch's or PyTorch's profiler.

    python3 scripts/report/trace_summary.py TRACE.json --steps 5 [--top 20]

TRACE.json comes from `ltrain bench step --profile TRACE.json` (5 steps) or from
torch.profiler's export_chrome_trace (scripts/pytorch/bench_pytorch.py --profile-dir). Prints, per step:
host operators by self time (time not spent in a nested operator), CUDA runtime calls (launches,
synchronizations, allocations), GPU kernels by count and time, and GPU time by kernel family
(torch.compile's Triton kernels, convolutions and matmuls, BatchNorm, copies and sets, the rest).
"""
import argparse
import collections
import json


def load_events(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def self_times(ops):
    """Self time of each host operator: its duration less that of operators nested in it (same thread)."""
    by_thread = collections.defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    result = collections.defaultdict(float)
    counts = collections.Counter()
    top_level = 0.0
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, self time so far]
        for e in events:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done, own = stack.pop()
                result[done["name"]] += own
            if stack:
                stack[-1][1] -= e["dur"]
            else:
                top_level += e["dur"]
            stack.append([e, e["dur"]])
            counts[e["name"]] += 1
        for done, own in stack:
            result[done["name"]] += own
    return result, counts, top_level


# Kernel families, first match wins: Inductor names its Triton kernels after every operator they
# fuse ("triton_poi_fused__native_batch_norm_legit_functional_convolution_backward_..."), so they
# are told apart before any operator name is looked for.
KERNEL_FAMILIES = (
    ("Triton (torch.compile's fused kernels)", lambda name: name.startswith("triton")),
    ("convolution and matmul (cuDNN, cuBLAS, CUTLASS)",
     lambda name: any(mark in name for mark in ("xmma", "nvjet", "gemm", "cutlass", "cudnn", "implicit_conv"))),
    ("BatchNorm (ATen's and ltrain's)", lambda name: "batch_norm" in name),
)
# The profiler's categories of GPU events: copies and sets, and with kernels all of them.
COPY_AND_SET_CATEGORIES = ("gpu_memcpy", "gpu_memset")
GPU_EVENT_CATEGORIES = ("kernel",) + COPY_AND_SET_CATEGORIES
COPIES_AND_SETS = "copies and sets"
OTHER_KERNELS = "other kernels"


def kernel_family(event):
    """The family of a GPU event (kernel, copy or set) for the by-family totals."""
    if event.get("cat") in COPY_AND_SET_CATEGORIES:
        return COPIES_AND_SETS
    for family, matches in KERNEL_FAMILIES:
        if matches(event["name"]):
            return family
    return OTHER_KERNELS


def print_totals_by_family(events, per_step):
    """GPU time and event count per kernel family, busiest first."""
    by_family = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in GPU_EVENT_CATEGORIES:
            totals = by_family[kernel_family(e)]
            totals[0] += 1
            totals[1] += e["dur"]
    print("\nGPU time by kernel family")
    rows = [(family, f"{n * per_step:.1f}", f"{t * per_step / 1000:.3f}")
            for family, (n, t) in sorted(by_family.items(), key=lambda kv: -kv[1][1])]
    if rows:
        print(table(rows, ("family", "count/step", "ms/step")))


def table(rows, headers):
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def print_totals_by_name(events, categories, title, time_label, headers, name_width, per_step, top):
    """Count and total duration per event name for the events of `categories`, busiest first."""
    chosen = [e for e in events if e.get("cat") in categories]
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in chosen:
        by_name[e["name"]][0] += 1
        by_name[e["name"]][1] += e["dur"]
    print(f"\n{title}: {len(chosen) * per_step:.0f} per step, "
          f"{sum(e['dur'] for e in chosen) * per_step / 1000:.2f} {time_label}")
    rows = [(name[:name_width], f"{n * per_step:.1f}", f"{t * per_step / 1000:.3f}")
            for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]]
    if rows:
        print(table(rows, headers))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=5, help="training steps in the trace")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args()
    events = load_events(args.trace)
    per_step = 1.0 / args.steps

    ops = [e for e in events if e.get("cat") in ("cpu_op", "operator", "user_annotation")]
    own, counts, top_level = self_times(ops)
    print(f"host operators: {sum(counts.values()) * per_step:.0f} per step, "
          f"{top_level * per_step / 1000:.2f} ms per step in top-level operators")
    rows = [(name[:70], f"{counts[name] * per_step:.1f}", f"{t * per_step / 1000:.3f}")
            for name, t in sorted(own.items(), key=lambda kv: -kv[1])[:args.top]]
    print(table(rows, ("operator", "calls/step", "self ms/step")))

    print_totals_by_name(events, ("cuda_runtime", "cuda_driver"), "CUDA runtime/driver calls", "ms per step",
                         ("call", "calls/step", "ms/step"), 50, per_step, args.top)
    print_totals_by_name(events, GPU_EVENT_CATEGORIES, "GPU kernels, copies and sets",
                         "ms per step of GPU time", ("kernel", "count/step", "ms/step"), 90, per_step, args.top)
    print_totals_by_family(events, per_step)


if __name__ == "__main__":
    main()
