#!/usr/bin/env python3
"""How busy a training step keeps the GPU, from a Chrome trace of LibTorch's or PyTorch's profiler
(CUPTI's kernel records: start, duration, stream, grid and blocks per SM).

    python3 scripts/report/step_timeline.py TRACE.json [TRACE.json ...] --steps 5 [--sms 132] [--json OUT] [--gaps]

Per step, from the first GPU event of the trace to the last (a trace of `ltrain bench step --profile`
holds 5 steps and nothing else on the GPU):
  kernels        kernels a step
  step_ms        the trace's GPU span over the steps
  busy           share of the span in which some kernel, copy or set runs
  gaps_ms        the span in which nothing runs on the GPU, a step; gaps counts the idle stretches
  sm_share       time-weighted share of the SMs that hold a block of some kernel: at each moment
                 min(1, the sum over running kernels of min(1, blocks / SMs)), averaged over the busy
                 time (over the kernels' own time where one kernel runs at a time)
  sm_share_conv, sm_share_batch_norm   the same over convolution and BatchNorm kernels alone,
                 weighted by each kernel's own time
  time_conv, time_batch_norm, time_optimizer   each family's share of the kernels' summed time
                 (the optimizer's: the update, the GradScaler's unscale and inf check); the rest is
                 pooling, the loss, casts and copies
  overlap        share of the span in which two or more kernels run at once
  streams        the streams with kernels; critical_ms, the busiest stream's kernel time a step: the
                 step cannot be shorter with those kernels kept on those streams (the trace holds no
                 dependencies, so this is the bound it shows). A replayed graph with parallel
                 branches runs them on streams the driver picks, not on the captured ones: there the
                 two columns say only that work ran side by side.
Prints one Markdown row per trace (the file name says which) and, with --json, writes the numbers.
With --gaps, a second table: the idle stretches a step by the families of the event that ended last
before each (BatchNorm, convolution, optimizer, copy for copies and sets, other) and of the one that
starts it, the longest first: what a kernel launched early could hide (a programmatic dependent
launch hides part of the stretch before it). The stretches before the first step and after the
last (the batch made, the numbers read back) count with the rest, as copy and other rows. The
JSON holds them as "gaps_between".
Blocks per SM come from the trace's "blocks per SM" where the profiler wrote it, else from the
grid over --sms.
"""
import argparse
import json
import os
import sys

GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Kernel families by name, BatchNorm first: cuDNN's own BatchNorm kernels (bn_fw_*, bn_bw_*) carry
# "cudnn" in their names too.
BATCH_NORM_MARKS = ("batch_norm", "batchnorm", "bn_fw", "bn_bw")
CONVOLUTION_MARKS = ("xmma", "nvjet", "gemm", "cutlass", "cudnn", "implicit_conv", "fprop", "dgrad", "wgrad")
# ltrain's sgd_kernel and find_inf_kernel; LibTorch's fused and multi-tensor SGD and AdamW, and its
# GradScaler's _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_.
OPTIMIZER_MARKS = ("sgd", "adam", "find_inf", "multi_tensor", "amp_", "non_finite", "unscale")

COLUMNS = (("kernels", "kernels", "{:.0f}"), ("step_ms", "step ms", "{:.3f}"), ("busy", "busy", "{:.0%}"),
           ("gaps_ms", "gaps ms", "{:.3f}"), ("gaps", "gaps", "{:.0f}"), ("sm_share", "SMs with a block", "{:.0%}"),
           ("sm_share_conv", "conv", "{:.0%}"), ("sm_share_batch_norm", "BatchNorm", "{:.0%}"),
           ("time_conv", "conv time", "{:.0%}"), ("time_batch_norm", "BatchNorm time", "{:.0%}"),
           ("time_optimizer", "optimizer time", "{:.0%}"),
           ("overlap", "2+ kernels", "{:.0%}"), ("streams", "streams", "{:.0f}"),
           ("critical_ms", "busiest stream ms", "{:.3f}"))


def load_gpu_events(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATEGORIES and "dur" in e]


def sm_fraction(event, sms):
    """min(1, blocks / SMs) of a kernel."""
    args = event.get("args", {})
    if "blocks per SM" in args:
        return min(1.0, float(args["blocks per SM"]))
    grid = args.get("grid")
    if grid and sms:
        blocks = 1
        for side in grid:
            blocks *= side
        return min(1.0, blocks / sms)
    raise ValueError(f"kernel {event['name'][:60]} has neither 'blocks per SM' nor a grid: pass --sms")


def union_length(intervals):
    """Total length covered by [start, end) intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def idle_stretches(events):
    """The stretches between the first start and the last end that no event covers, in order:
    [(the event that reached furthest before, the event that ends the stretch, its length)]."""
    stretches, reach, reacher = [], None, None
    for e in sorted(events, key=lambda e: (e["ts"], e["ts"] + e["dur"])):
        end = e["ts"] + e["dur"]
        if reach is not None and e["ts"] > reach:
            stretches.append((reacher, e, e["ts"] - reach))
        if reach is None or end > reach:
            reach, reacher = end, e
    return stretches


def sweep(kernels, sms):
    """Integrals over time of min(1, sum of running kernels' SM fractions) and of [two or more run]."""
    points = []
    for e in kernels:
        share = sm_fraction(e, sms)
        points.append((e["ts"], 1, share))
        points.append((e["ts"] + e["dur"], -1, share))
    points.sort(key=lambda p: (p[0], p[1]))  # ends before starts at the same moment
    running, share_sum, filled, overlapped, last = 0, 0.0, 0.0, 0.0, None
    for time, change, share in points:
        if last is not None and time > last:
            filled += min(1.0, share_sum) * (time - last)
            if running >= 2:
                overlapped += time - last
        running += change
        share_sum += change * share
        last = time
    return filled, overlapped


def has_mark(event, marks):
    name = event["name"].lower()
    return any(mark in name for mark in marks)


def family(event):
    """The family a GPU event belongs to, BatchNorm's marks first, as the time shares count them."""
    if event.get("cat") != "kernel":
        return "copy"
    for name, marks in (("BatchNorm", BATCH_NORM_MARKS), ("convolution", CONVOLUTION_MARKS),
                        ("optimizer", OPTIMIZER_MARKS)):
        if has_mark(event, marks):
            return name
    return "other"


def gaps_between(stretches, steps):
    """idle_stretches' stretches by (family of the event before, family of the one after):
    {"before > after": {"us": idle microseconds a step, "stretches": a step}}, the longest first."""
    found = {}
    for before, after, length in stretches:
        entry = found.setdefault(f"{family(before)} > {family(after)}", {"us": 0.0, "stretches": 0.0})
        entry["us"] += length / steps
        entry["stretches"] += 1 / steps
    return dict(sorted(found.items(), key=lambda item: -item[1]["us"]))


def weighted_share(kernels, sms):
    time = sum(e["dur"] for e in kernels)
    return sum(sm_fraction(e, sms) * e["dur"] for e in kernels) / time if time else float("nan")


def time_share(family, kernels):
    total = sum(e["dur"] for e in kernels)
    return sum(e["dur"] for e in family) / total


def summarize(events, steps, sms=None):
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:
        raise ValueError("the trace holds no GPU kernels")
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in events]
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    busy = union_length(intervals)
    stretches = idle_stretches(events)
    filled, overlapped = sweep(kernels, sms)
    kernel_busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    by_stream = {}
    for e in kernels:
        by_stream.setdefault(e.get("args", {}).get("stream", 0), []).append((e["ts"], e["ts"] + e["dur"]))
    batch_norm = [e for e in kernels if has_mark(e, BATCH_NORM_MARKS)]
    conv = [e for e in kernels if not has_mark(e, BATCH_NORM_MARKS) and has_mark(e, CONVOLUTION_MARKS)]
    optimizer = [e for e in kernels if not has_mark(e, BATCH_NORM_MARKS + CONVOLUTION_MARKS)
                 and has_mark(e, OPTIMIZER_MARKS)]
    return {
        "kernels": len(kernels) / steps,
        "step_ms": span / steps / 1000,
        "busy": busy / span,
        "gaps_ms": sum(length for _, _, length in stretches) / steps / 1000,
        "gaps": len(stretches) / steps,
        "sm_share": filled / kernel_busy,
        "sm_share_conv": weighted_share(conv, sms),
        "sm_share_batch_norm": weighted_share(batch_norm, sms),
        "time_conv": time_share(conv, kernels),
        "time_batch_norm": time_share(batch_norm, kernels),
        "time_optimizer": time_share(optimizer, kernels),
        "overlap": overlapped / span,
        "streams": len(by_stream),
        "critical_ms": max(union_length(v) for v in by_stream.values()) / steps / 1000,
        "gaps_between": gaps_between(stretches, steps),
    }


def markdown(rows):
    lines = ["| trace | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for name, row in rows:
        lines.append(f"| {name} | " + " | ".join(form.format(row[key]) for key, _, form in COLUMNS) + " |")
    return "\n".join(lines)


def gaps_markdown(rows):
    lines = ["| trace | idle between | us a step | stretches a step |", "|---|---|---|---|"]
    for name, row in rows:
        for between, entry in row["gaps_between"].items():
            lines.append(f"| {name} | {between} | {entry['us']:.1f} | {entry['stretches']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("traces", nargs="+")
    p.add_argument("--steps", type=int, default=5, help="training steps in each trace")
    p.add_argument("--sms", type=int, help="the GPU's SM count, where the trace has no 'blocks per SM'")
    p.add_argument("--json", metavar="OUT", help="also write the numbers here")
    p.add_argument("--gaps", action="store_true", help="also print the idle stretches by the kernels around them")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be 1 or more")
    rows = []
    for path in args.traces:
        try:
            rows.append((os.path.splitext(os.path.basename(path))[0], summarize(load_gpu_events(path), args.steps,
                                                                                args.sms)))
        except (OSError, ValueError, KeyError) as error:
            print(f"step_timeline: {path}: {error}", file=sys.stderr)
            return 3
    print(markdown(rows))
    if args.gaps:
        print()
        print(gaps_markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: row for name, row in rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
