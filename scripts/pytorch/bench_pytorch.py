#!/usr/bin/env python3
"""PyTorch baseline for ltrain's step benchmark: torchvision ResNet training throughput on CUDA.

Runs the recipe ltrain runs (SGD lr 0.01, momentum 0.9, weight decay 5e-4, cross-entropy, 10
classes, 32x32 inputs; at lr 0.1 both diverge on random labels, and fp16's GradScaler then skips
steps, which would time a cheaper step than training does) over a grid of batch sizes, precisions, memory formats and execution modes,
and reports ms/step, images/s and peak memory per configuration, side by side with ltrain's numbers.

    python3 scripts/pytorch/bench_pytorch.py --arch resnet50 --stem imagenet --batch-sizes 256 512 \
        --precision fp32 tf32 fp16 bf16 --channels-last both --modes eager compile graph \
        --steps 50 --warmup 15 --json OUT.json [--checkpoint-segments 0 4] [--matmul]

Modes:
  eager    plain PyTorch, the reference.
  compile  torch.compile(model, mode="reduce-overhead"); compile time reported apart (compile_s).
  graph    the whole step (forward, loss, backward, SGD step) captured by hand in one CUDA graph,
           following the whole-network capture pattern of the PyTorch CUDA graphs notes. fp16 runs
           there without a GradScaler (its dynamic step is not capturable): precision "fp16 (no scaler)".
A configuration that fails (out of memory, a compile error) becomes a row with an "error" field;
the run goes on. The JSON file is rewritten after every row, so a killed run keeps what it measured.
Memory: peak_mem_gib counts from the start of a configuration (for the first configuration that
meets a shape it includes cudnn.benchmark's trial workspaces); steady_mem_gib only the timed steps;
steady_reserved_gib what the allocator held over them after emptying its cache (a graph's pool included).

Duration (measured on an H200, torch 2.11): the resnet50 grid above (48 configurations) takes
about 17 minutes, mostly torch.compile (about 45 s per compiled configuration) and cudnn.benchmark
searches in eager warm-ups (up to 17 s); split it, e.g. one run per --modes, to fit a 10-minute limit.
"""
import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torchvision

from torchvision_models import ARCHS, NUM_CLASSES, SegmentCheckpointed, build_model

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
MODES = ("eager", "compile", "graph")
IMAGE_SIZE = 32          # the default side of the random square images (--image-size)
DATA_POOL = 4            # distinct pre-generated batches, cycled through
GRAPH_SIDE_WARMUP = 3    # eager iterations on a side stream before capture (the docs use 3)
PROFILED_STEPS = 5       # as ltrain bench step --profile
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4  # as configs/bench/resnet50-step.json
GIB = float(1 << 30)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", nargs="+", default=["resnet50"], choices=ARCHS)
    p.add_argument("--stem", default="imagenet", choices=("imagenet", "cifar"),
                   help="cifar: 3x3 stride-1 conv1 and no maxpool")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[256])
    p.add_argument("--image-size", type=int, default=IMAGE_SIZE, help="side of the square images, in pixels")
    p.add_argument("--precision", nargs="+", default=["fp32", "tf32", "fp16", "bf16"], choices=PRECISIONS)
    p.add_argument("--channels-last", default="both", choices=("on", "off", "both"))
    p.add_argument("--modes", nargs="+", default=["eager"], choices=MODES)
    p.add_argument("--checkpoint-segments", nargs="+", type=int, default=[0],
                   help="activation checkpointing as ltrain's model.checkpoint_segments (0: off)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=15, help="untimed steps before timing")
    p.add_argument("--sgd", default="foreach", choices=("foreach", "fused"),
                   help="torch.optim.SGD's kernels: foreach (its default) or fused=True")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="write header, rows and matmul results here")
    p.add_argument("--profile-dir", metavar="DIR",
                   help="after timing each configuration, profile PROFILED_STEPS more steps and write "
                        "their Chrome trace to DIR (scripts/report/trace_summary.py reads it)")
    p.add_argument("--matmul", action="store_true", help="also run the square-matmul TFLOPS test")
    p.add_argument("--matmul-n", type=int, default=8192)
    p.add_argument("--matmul-warmup", type=int, default=10)
    p.add_argument("--matmul-iters", type=int, default=100)
    p.add_argument("--skip-train", action="store_true", help="only the matmul test")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1")
    if any(b < 1 for b in args.batch_sizes):
        p.error("--batch-sizes must be positive")
    if any(s < 0 for s in args.checkpoint_segments):
        p.error("--checkpoint-segments must be >= 0")
    return args


# ----------------------------------------------------------------------------------------------
# Setup

def set_precision_flags(precision):
    """TF32 on only for "tf32"; cudnn.benchmark always on."""
    tf32 = precision == "tf32"
    with warnings.catch_warnings():
        # torch >= 2.9 suggests the fp32_precision API; the allow_tf32 flags still work.
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True


def autocast_dtype(precision):
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)


def autocast(amp_dtype, cache_enabled=True):
    """CUDA autocast to amp_dtype, or nothing for fp32/tf32 (amp_dtype None)."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=amp_dtype, cache_enabled=cache_enabled)


def make_data(batch, image_size, channels_last, device):
    """DATA_POOL random batches on the device: normalized-like images [B,3,S,S], labels [B]."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    images = [torch.randn(batch, 3, image_size, image_size, device=device).contiguous(memory_format=fmt)
              for _ in range(DATA_POOL)]
    labels = [torch.randint(0, NUM_CLASSES, (batch,), device=device) for _ in range(DATA_POOL)]
    return images, labels


# ----------------------------------------------------------------------------------------------
# Steps

def eager_step(model, criterion, optimizer, scaler, amp_dtype, x, y, cache_enabled=True):
    """One training step; returns the loss tensor (no host sync unless the GradScaler does one)."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(amp_dtype, cache_enabled):
        loss = criterion(model(x), y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss


def capture_whole_step(model, criterion, optimizer, amp_dtype, x0, y0):
    """Capture forward + loss + backward + SGD step in one CUDA graph (no GradScaler).

    Returns (graph, static_x, static_y, static_loss). Pattern of the PyTorch CUDA graphs notes:
    warm up on a side stream (creates the momentum buffers, runs cudnn.benchmark's search),
    set grads to None, then capture; autocast's weight cache must be off inside a capture.
    """
    static_x, static_y = x0.clone(), y0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_SIDE_WARMUP):
            eager_step(model, criterion, optimizer, None, amp_dtype, static_x, static_y, cache_enabled=False)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        with autocast(amp_dtype, cache_enabled=False):
            static_loss = criterion(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()
    return graph, static_x, static_y, static_loss


def time_steps(step, steps):
    """Run step(i) `steps` times between CUDA events. Returns (mean ms, median ms).

    mean = first start to last end / steps (the throughput, gaps included);
    median = over the per-step event pairs.
    """
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    for i in range(steps):
        starts[i].record()
        step(i)
        ends[i].record()
    torch.cuda.synchronize()
    per_step = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return starts[0].elapsed_time(ends[-1]) / steps, statistics.median(per_step)


def trace_name(cfg):
    return "pytorch-{arch}-{stem}-{mode}-{precision}-{cl}-seg{checkpoint_segments}-b{batch}.json".format(
        cl="cl" if cfg["channels_last"] else "nchw", **cfg)


def run_config(cfg, warmup, steps, device, profile_dir=None):
    """Measure one configuration. Returns the result fields (raises on failure)."""
    set_precision_flags(cfg["precision"])
    amp_dtype = autocast_dtype(cfg["precision"])
    fmt = torch.channels_last if cfg["channels_last"] else torch.contiguous_format
    model = build_model(cfg["arch"], cfg["stem"])
    if cfg["checkpoint_segments"]:
        model = SegmentCheckpointed(model, cfg["checkpoint_segments"])
    model = model.to(device=device, memory_format=fmt).train()
    criterion = nn.CrossEntropyLoss()
    # Named either way: fused=False alone would also turn the for-each kernels off (a loop over tensors).
    kernels = dict(fused=True) if cfg["sgd"] == "fused" else dict(foreach=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, **kernels)
    images, labels = make_data(cfg["batch"], cfg["image_size"], cfg["channels_last"], device)
    use_scaler = cfg["precision"] == "fp16" and cfg["mode"] != "graph"
    scaler = torch.amp.GradScaler("cuda") if use_scaler else None
    extra = {}

    if cfg["mode"] == "graph":
        t0 = time.perf_counter()
        graph, static_x, static_y, static_loss = capture_whole_step(
            model, criterion, optimizer, amp_dtype, images[0], labels[0])
        torch.cuda.synchronize()
        extra["capture_s"] = round(time.perf_counter() - t0, 3)

        def step(i):
            static_x.copy_(images[i % DATA_POOL])
            static_y.copy_(labels[i % DATA_POOL])
            graph.replay()
        last_loss = lambda: static_loss  # noqa: E731
    else:
        net = model
        if cfg["mode"] == "compile":
            net = torch.compile(model, mode="reduce-overhead")
        mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
        losses = []

        def step(i):
            if cfg["mode"] == "compile" and mark_step is not None:
                mark_step()
            losses[:] = [eager_step(net, criterion, optimizer, scaler, amp_dtype,
                                    images[i % DATA_POOL], labels[i % DATA_POOL])]
        last_loss = lambda: losses[0]  # noqa: E731

        if cfg["mode"] == "compile":
            t0 = time.perf_counter()
            step(0)  # compiles forward and backward
            torch.cuda.synchronize()
            extra["compile_s"] = round(time.perf_counter() - t0, 3)

    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    extra["warmup_s"] = round(time.perf_counter() - t0, 3)
    # peak_mem_gib counts from the start of the config (cudnn.benchmark's trial workspaces
    # included, for the first config that meets a shape); steady_mem_gib only the timed steps.
    peak_setup = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()  # so that reserved memory counts what the steps hold (a graph's pool too)
    torch.cuda.reset_peak_memory_stats(device)

    ms_mean, ms_median = time_steps(step, steps)
    steady = torch.cuda.max_memory_allocated(device)
    steady_reserved = torch.cuda.max_memory_reserved(device)
    loss = float(last_loss().detach().float().item())
    if profile_dir:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            for i in range(PROFILED_STEPS):
                step(i)
            torch.cuda.synchronize()
        extra["profile_trace"] = os.path.join(profile_dir, trace_name(cfg))
        profiler.export_chrome_trace(extra["profile_trace"])
    return dict(ms_per_step=round(ms_mean, 3), ms_median=round(ms_median, 3),
                img_per_s=round(cfg["batch"] * 1000.0 / ms_mean, 1),
                peak_mem_gib=round(max(peak_setup, steady) / GIB, 3), steady_mem_gib=round(steady / GIB, 3),
                steady_reserved_gib=round(steady_reserved / GIB, 3),
                final_loss=round(loss, 4), **extra)


def free_cuda_memory():
    """Release what the last configuration held. Never raises: after a sticky CUDA error the
    following rows fail on their own and say so."""
    try:
        gc.collect()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # drops compiled graphs and their CUDA graph pools
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001
        print(f"bench_pytorch: warning: freeing memory failed: {describe_error(exc)}", file=sys.stderr)


def peak_gib(device):
    try:
        return round(torch.cuda.max_memory_allocated(device) / GIB, 3)
    except Exception:  # noqa: BLE001
        return None


def describe_error(exc):
    """'out of memory', or the exception's type and first line."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    text = str(exc).strip()
    if (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in text.lower():
        return "out of memory"
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(exc).__name__}: {first}"


def measure(cfg, warmup, steps, device, profile_dir=None):
    """run_config inside the safety net: every failure becomes the row's error field."""
    row = dict(cfg)
    row["channels_last"] = bool(cfg["channels_last"])
    if cfg["mode"] == "graph" and cfg["precision"] == "fp16":
        row["precision"] = "fp16 (no scaler)"
    free_cuda_memory()
    try:
        torch.cuda.reset_peak_memory_stats(device)
        row.update(run_config(cfg, warmup, steps, device, profile_dir))
        row["error"] = None
    except Exception as exc:  # noqa: BLE001 - a failed config must not end the run
        row["error"] = describe_error(exc)
        if row["error"] != "out of memory":
            traceback.print_exc(limit=6, file=sys.stderr)
        row["peak_mem_gib"] = peak_gib(device)
    free_cuda_memory()
    return row


# ----------------------------------------------------------------------------------------------
# Matmul

def matmul_tflops(precision, n, warmup, iters, device):
    """Square n x n matmul throughput in TFLOPS (2 n^3 per product)."""
    set_precision_flags(precision)
    dtype = autocast_dtype(precision) or torch.float32
    row = dict(precision=precision, n=n, iters=iters, dtype=str(dtype).replace("torch.", ""))
    free_cuda_memory()
    try:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=c)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.mm(a, b, out=c)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000.0
        row.update(ms_per_matmul=round(seconds * 1000.0 / iters, 4),
                   tflops=round(2.0 * n ** 3 * iters / seconds / 1e12, 2), error=None)
        del a, b, c
    except Exception as exc:  # noqa: BLE001
        row["error"] = describe_error(exc)
    free_cuda_memory()
    return row


# ----------------------------------------------------------------------------------------------
# Reporting

def make_header(device, argv, image_size, sgd):
    props = torch.cuda.get_device_properties(device)
    return dict(tool="scripts/pytorch/bench_pytorch.py", argv=argv,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                host=platform.node(), python=platform.python_version(),
                torch=torch.__version__, torchvision=torchvision.__version__,
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                gpu=torch.cuda.get_device_name(device), gpu_mem_gib=round(props.total_memory / GIB, 1),
                recipe=dict(optimizer="SGD", sgd_kernels=sgd, lr=LR, momentum=MOMENTUM,
                            weight_decay=WEIGHT_DECAY,
                            loss="CrossEntropyLoss", num_classes=NUM_CLASSES, image_size=image_size,
                            data="random, on device", cudnn_benchmark=True))


def write_json(path, header, rows, matmul):
    """Atomic rewrite: a temp file renamed over the target."""
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(dict(header=header, rows=rows, matmul=matmul), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def format_table(rows, matmul):
    cols = [("arch", "arch"), ("stem", "stem"), ("mode", "mode"), ("precision", "precision"),
            ("channels_last", "cl"), ("checkpoint_segments", "segments"), ("batch", "batch"), ("ms_per_step", "ms/step"),
            ("ms_median", "median"), ("img_per_s", "img/s"), ("peak_mem_gib", "peak GiB"),
            ("steady_mem_gib", "steady GiB"),
            ("compile_s", "compile s"), ("error", "error")]
    lines = []
    if rows:
        table = [[h for _, h in cols]]
        for r in rows:
            table.append(["" if r.get(k) is None else
                          ("on" if r[k] is True else "off" if r[k] is False else str(r[k]))
                          for k, _ in cols])
        widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
        for t in table:
            lines.append("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
    if matmul:
        lines.append("")
        lines.append("matmul n=%d" % matmul[0]["n"])
        for m in matmul:
            lines.append("  %-5s %-9s %s" % (m["precision"], m["dtype"],
                                             m["error"] or "%.1f TFLOPS (%.3f ms)" % (m["tflops"], m["ms_per_matmul"])))
    return "\n".join(lines)


def configs(args):
    cl_values = {"on": [True], "off": [False], "both": [False, True]}[args.channels_last]
    for arch in args.arch:
        for batch in args.batch_sizes:
            for channels_last in cl_values:
                for precision in args.precision:
                    for segments in args.checkpoint_segments:
                        for mode in args.modes:
                            yield dict(arch=arch, stem=args.stem, mode=mode, precision=precision,
                                       channels_last=channels_last, checkpoint_segments=segments, batch=batch,
                                       image_size=args.image_size, sgd=args.sgd)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_pytorch: CUDA is not available; this baseline runs on a GPU host", file=sys.stderr)
        return 3
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)
    header = make_header(device, argv, args.image_size, args.sgd)
    if args.profile_dir:
        os.makedirs(args.profile_dir, exist_ok=True)
    print("bench_pytorch: torch %s, CUDA %s, cuDNN %s, %s" % (header["torch"], header["cuda"],
                                                            header["cudnn"], header["gpu"]), flush=True)
    rows, matmul = [], []
    if args.matmul:
        for precision in PRECISIONS:
            matmul.append(matmul_tflops(precision, args.matmul_n, args.matmul_warmup, args.matmul_iters, device))
            print("matmul", json.dumps(matmul[-1]), flush=True)
            write_json(args.json, header, rows, matmul)
    if not args.skip_train:
        for cfg in configs(args):
            rows.append(measure(cfg, args.warmup, args.steps, device, args.profile_dir))
            print("row", json.dumps(rows[-1]), flush=True)
            write_json(args.json, header, rows, matmul)
    print()
    print(format_table(rows, matmul))
    if args.json:
        print(f"\nbench_pytorch: wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
