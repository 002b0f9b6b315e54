#!/usr/bin/env python3
"""A lower bound on ResNet-50's training step from FLOPs and bytes moved, layer by layer.

    python3 scripts/report/step_model.py --batch 256 --stem imagenet --bandwidth-tbs B --matmul-tflops F \\
        [--kernel-floor-us U] [--measured-img-per-s X] [--trace TRACE.json --steps 5] [--fused-forward PAIRS.txt]

Every layer of torchvision's ResNet-50 (bottlenecks [3, 4, 6, 3], 10 classes, square inputs of
--image-size) is counted for one training step (forward, backward, SGD), with 16-bit activations:
  - FLOPs: 2*N*H*W*Cout*Cin*k*k / groups a convolution's forward, the same again for each of its
    backward's data and weight gradients (no data gradient for the first convolution);
  - bytes: the smallest traffic each kernel needs, under two execution plans:
      today: each convolution reads its input and writes its output; each BatchNorm reads its
        input twice (statistics, then normalize with ReLU and the residual add) and writes once;
        its backward reads the output gradient and input twice and writes once;
      fused: a convolution also produces its output's per-channel sums; the next convolution
        applies BatchNorm's scale, bias and ReLU to its input as it loads it, so the normalized
        activation is never written, except a block's output (BatchNorm, add, ReLU: read two, write
        one), which two consumers read; the backward's data-gradient convolution applies the ReLU
        and BatchNorm gradients to its input as it loads it, and its epilogue sums what the next
        BatchNorm gradient needs.
A kernel takes at least max(FLOPs / matmul rate, bytes / bandwidth, kernel floor); the step's bound
is the sum over its kernels, plus the SGD step over the float32 weights (18 bytes a parameter:
weight, gradient and momentum read; weight, momentum and the 16-bit copy written).

The two rates are measurements, not data-sheet numbers: HBM bandwidth from a large device-to-device
copy, the matmul rate from `ltrain bench matmul`. --kernel-floor-us is the shortest time a kernel
takes inside a CUDA graph (launch and tail), read off a profile. --trace adds the measured GPU time
of each kind of kernel from `ltrain bench step --profile` (Chrome trace) beside the bounds.
--fused-forward takes the per-layer table of scripts/kernels/bench-fused-conv.sh (same workload) and
charges the fused plan's forward convolutions what ltrain's convolution with the statistics epilogue
measured there, where that is longer than their bound: the fused plan's bound with today's fused
kernel in it, every other kernel of the plan still at its bound.
"""
import argparse
import collections
import json
import math
import sys

ACTIVATION_BYTES = 2  # fp16 / bf16 activations and their gradients
WEIGHT_BYTES = 2      # the 16-bit weight copies the convolutions read
SGD_BYTES_PER_PARAMETER = 18


class Layer:
    """One layer's share of a training step: FLOPs, bytes and kernel launches, per plan."""

    def __init__(self, stage, name, kind, flops=0.0, kernels=None, bytes_=None, conv=None):
        self.stage, self.name, self.kind = stage, name, kind
        self.flops = flops                       # forward + backward
        self.kernels = kernels or {"today": 0, "fused": 0}
        self.bytes = bytes_ or {"today": 0.0, "fused": 0.0}
        # A convolution's (c_in, c_out, k, stride, h_in) and its forward kernel's FLOPs and bytes.
        self.conv = conv
        self.forward_flops, self.forward_bytes = 0.0, 0.0


def conv_layer(stage, name, n, h_in, c_in, c_out, k, stride, groups=1, first=False, fused_input=True):
    """A k x k convolution on [n, h_in, h_in, c_in] (padding k // 2); returns (Layer, h_out)."""
    h_out = math.ceil(h_in / stride)
    x = n * h_in * h_in * c_in * ACTIVATION_BYTES
    y = n * h_out * h_out * c_out * ACTIVATION_BYTES
    w = c_out * c_in // groups * k * k * WEIGHT_BYTES
    forward = 2.0 * n * h_out * h_out * c_out * c_in // groups * k * k
    flops = forward * (2 if first else 3)
    # forward: read x, w, write y; data gradient: read dy, w, write dx; weight gradient: read dy, x.
    moved = (x + w + y) + (0 if first else y + w + x) + (y + x + w)
    kernels = 1 + (0 if first else 1) + 1
    layer = Layer(stage, name, "convolution", flops,
                  {"today": kernels, "fused": kernels}, {"today": moved, "fused": moved},
                  conv=(c_in, c_out, k, stride, h_in))
    layer.forward_flops, layer.forward_bytes = forward, x + w + y
    return layer, h_out


def batchnorm_layer(stage, name, n, h, c, block_output):
    """BatchNorm (+ ReLU, + the residual add when `block_output`) on [n, h, h, c]."""
    t = n * h * h * c * ACTIVATION_BYTES
    residual = t if block_output else 0
    # today: statistics pass, normalize pass; backward: reduction pass, gradient pass.
    today = (t) + (t + residual + t) + (2 * t) + (2 * t + t + residual)
    if block_output:
        # fused: statistics come from the convolution; the output is still written once (two consumers
        # read it), and its gradient is formed once for both branches.
        fused = (t + residual + t) + (2 * t + t)
        fused_kernels = 2
    else:
        fused = 0.0  # applied on the next convolution's load, its gradient on the data gradient's load
        fused_kernels = 0
    return Layer(stage, name, "batchnorm", 0.0, {"today": 4, "fused": fused_kernels}, {"today": today, "fused": fused})


def resnet50_layers(n, stem, image_size, num_classes=10):
    layers = []
    h = image_size
    if stem == "imagenet":
        conv, h = conv_layer("stem", "conv1 7x7/2", n, h, 3, 64, 7, 2, first=True)
        layers.append(conv)
        layers.append(batchnorm_layer("stem", "bn1", n, h, 64, block_output=False))
        h_pool = math.ceil(h / 2)
        pool_bytes = n * (h * h + h_pool * h_pool) * 64 * ACTIVATION_BYTES
        # max pool: the stem's normalized output has to exist for it, in both plans.
        layers.append(Layer("stem", "maxpool 3x3/2", "pool", 0.0, {"today": 2, "fused": 3},
                            {"today": 2 * pool_bytes, "fused": 2 * pool_bytes + 2 * n * h * h * 64 * ACTIVATION_BYTES}))
        h = h_pool
    else:
        conv, h = conv_layer("stem", "conv1 3x3", n, h, 3, 64, 3, 1, first=True)
        layers.append(conv)
        layers.append(batchnorm_layer("stem", "bn1", n, h, 64, block_output=True))
    c_in = 64
    for stage_index, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        stage = f"layer{stage_index + 1}"
        c_out = width * 4
        for block in range(blocks):
            stride = 2 if block == 0 and stage_index > 0 else 1
            prefix = f"{stage}.{block}"
            conv, h1 = conv_layer(stage, prefix + ".conv1", n, h, c_in, width, 1, 1)
            layers += [conv, batchnorm_layer(stage, prefix + ".bn1", n, h1, width, False)]
            conv, h2 = conv_layer(stage, prefix + ".conv2", n, h1, width, width, 3, stride)
            layers += [conv, batchnorm_layer(stage, prefix + ".bn2", n, h2, width, False)]
            conv, h3 = conv_layer(stage, prefix + ".conv3", n, h2, width, c_out, 1, 1)
            layers.append(conv)
            if block == 0:
                conv, _ = conv_layer(stage, prefix + ".downsample", n, h, c_in, c_out, 1, stride)
                layers += [conv, batchnorm_layer(stage, prefix + ".downsample.bn", n, h3, c_out, False)]
            layers.append(batchnorm_layer(stage, prefix + ".bn3", n, h3, c_out, block_output=True))
            h, c_in = h3, c_out
    pooled = n * h * h * c_in * ACTIVATION_BYTES
    head_flops = 3 * 2.0 * n * c_in * num_classes
    layers.append(Layer("head", "avgpool + fc + loss", "other", head_flops, {"today": 6, "fused": 6},
                        {"today": 2 * pooled, "fused": 2 * pooled}))
    return layers


def parameter_count(num_classes=10):
    count, c_in = 64 * 3 * 7 * 7 + 2 * 64, 64
    for blocks, width in zip((3, 4, 6, 3), (64, 128, 256, 512)):
        c_out = width * 4
        for block in range(blocks):
            count += c_in * width + width * width * 9 + width * c_out + 2 * (2 * width + c_out)
            if block == 0:
                count += c_in * c_out + 2 * c_out
            c_in = c_out
    return count + c_in * num_classes + num_classes


def kernel_seconds(flops, moved, kernels, rates):
    if kernels == 0:
        return 0.0
    return max(flops / rates["flops"], moved / rates["bytes"], kernels * rates["floor"])


def read_fused_forward(path):
    """bench-fused-conv.sh's per-layer rows -> {(c_in, c_out, k, stride, side): fused + stats, seconds}.

    A row reads `| 64->256, 1/1, 32 | 3 | cuDNN us | fused + stats us | ...`; the stem's input channels
    are padded to 8 there (3 in the model)."""
    times = {}
    for line in open(path):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or "->" not in cells[0]:
            continue
        try:
            channels, kernel, side = (part.strip() for part in cells[0].split(","))
            c_in, c_out = (int(v) for v in channels.split("->"))
            k, stride = (int(v) for v in kernel.split("/"))
            fused_us = float(cells[3])
        except ValueError:
            continue
        if fused_us >= 0:
            times[(3 if c_in == 8 else c_in, c_out, k, stride, int(side))] = fused_us * 1e-6
    return times


def measured_forward_excess(layers, fused_forward, rates):
    """Seconds the fused plan gains by charging each forward convolution its measured fused time where
    longer than its bound; and the convolutions that the table has no row for."""
    excess, missing = 0.0, []
    for layer in layers:
        if layer.conv is None:
            continue
        measured = fused_forward.get(layer.conv)
        if measured is None:
            missing.append(layer.name)
            continue
        excess += max(0.0, measured - kernel_seconds(layer.forward_flops, layer.forward_bytes, 1, rates))
    return excess, missing


def classify_kernel(name):
    lowered = name.lower()
    if any(key in lowered for key in ("conv", "xmma", "gemm", "wgrad", "dgrad", "cudnn::", "sm90_", "sm80_")):
        return "convolution"
    if "batch_norm" in lowered or "batchnorm" in lowered or "bn_" in lowered:
        return "batchnorm"
    if "pool" in lowered:
        return "pool"
    if "sgd" in lowered or "multi_tensor" in lowered or "inf" in lowered:
        return "optimizer"
    return "other"


def measured_by_kind(trace, steps):
    with open(trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    seconds = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            seconds[classify_kernel(e.get("name", ""))] += e["dur"] * 1e-6 / steps
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--stem", choices=("imagenet", "cifar"), default="imagenet")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--bandwidth-tbs", type=float, required=True, help="measured HBM bandwidth, TB/s")
    p.add_argument("--matmul-tflops", type=float, required=True, help="measured 16-bit matmul rate, TFLOP/s")
    p.add_argument("--kernel-floor-us", type=float, default=0.0, help="shortest kernel in a graph, microseconds")
    p.add_argument("--measured-img-per-s", type=float, help="the step's measured speed, to set beside the bounds")
    p.add_argument("--trace", help="Chrome trace of `ltrain bench step --profile`")
    p.add_argument("--steps", type=int, default=5, help="steps in --trace")
    p.add_argument("--fused-forward", metavar="PAIRS.txt",
                   help="bench-fused-conv.sh output for this workload: the fused plan with its measured forwards")
    args = p.parse_args()
    if args.batch < 1 or args.bandwidth_tbs <= 0 or args.matmul_tflops <= 0 or args.image_size < 8:
        sys.exit("step_model: --batch, --bandwidth-tbs, --matmul-tflops must be positive, --image-size at least 8")

    rates = {"flops": args.matmul_tflops * 1e12, "bytes": args.bandwidth_tbs * 1e12, "floor": args.kernel_floor_us * 1e-6}
    layers = resnet50_layers(args.batch, args.stem, args.image_size)
    sgd_bytes = parameter_count() * SGD_BYTES_PER_PARAMETER
    layers.append(Layer("optimizer", "SGD step", "optimizer", 0.0, {"today": 1, "fused": 1},
                        {"today": sgd_bytes, "fused": sgd_bytes}))

    print(f"ResNet-50, {args.stem} stem, {args.image_size}x{args.image_size}, batch {args.batch}; "
          f"{args.bandwidth_tbs} TB/s, {args.matmul_tflops} TFLOP/s, kernel floor {args.kernel_floor_us} us\n")
    print("| stage | GFLOP | GB today | GB fused | kernels today / fused | bound today, ms | bound fused, ms | "
          "compute-bound share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    totals = collections.Counter()
    by_kind = collections.Counter()
    for stage in dict.fromkeys(layer.stage for layer in layers):
        members = [layer for layer in layers if layer.stage == stage]
        row = collections.Counter()
        for layer in members:
            today = kernel_seconds(layer.flops, layer.bytes["today"], layer.kernels["today"], rates)
            fused = kernel_seconds(layer.flops, layer.bytes["fused"], layer.kernels["fused"], rates)
            row.update(flops=layer.flops, today_bytes=layer.bytes["today"], fused_bytes=layer.bytes["fused"],
                       today_kernels=layer.kernels["today"], fused_kernels=layer.kernels["fused"],
                       today=today, fused=fused, compute=layer.flops / rates["flops"])
            by_kind[layer.kind] += today
        totals.update(row)
        print(f"| {stage} | {row['flops'] / 1e9:,.1f} | {row['today_bytes'] / 1e9:.3f} | "
              f"{row['fused_bytes'] / 1e9:.3f} | {row['today_kernels']} / {row['fused_kernels']} | "
              f"{row['today'] * 1e3:.3f} | {row['fused'] * 1e3:.3f} | "
              f"{row['compute'] / max(row['today'], 1e-12):.0%} |")
    print(f"| **step** | {totals['flops'] / 1e9:,.1f} | {totals['today_bytes'] / 1e9:.3f} | "
          f"{totals['fused_bytes'] / 1e9:.3f} | {totals['today_kernels']} / {totals['fused_kernels']} | "
          f"**{totals['today'] * 1e3:.3f}** | **{totals['fused'] * 1e3:.3f}** | "
          f"{totals['compute'] / totals['today']:.0%} |")
    print(f"\nbound today: {args.batch / totals['today']:,.0f} img/s; fused: {args.batch / totals['fused']:,.0f} img/s")
    if args.measured_img_per_s:
        measured = args.batch / args.measured_img_per_s
        print(f"measured: {args.measured_img_per_s:,.0f} img/s ({measured * 1e3:.3f} ms a step), "
              f"{totals['today'] / measured:.0%} of the way to today's bound, "
              f"fused bound {measured / totals['fused']:.2f}x faster than measured")
    if args.fused_forward:
        excess, missing = measured_forward_excess(layers, read_fused_forward(args.fused_forward), rates)
        if missing:
            sys.exit(f"step_model: {args.fused_forward} has no row for {', '.join(missing)}: "
                     "give bench-fused-conv.sh's output for the same stem, image size and batch")
        with_measured = totals["fused"] + excess
        print(f"fused, with ltrain's measured fused forwards: {with_measured * 1e3:.3f} ms "
              f"({args.batch / with_measured:,.0f} img/s; the forwards add {excess * 1e3:.3f} ms to the fused bound)")
    if args.trace:
        measured = measured_by_kind(args.trace, args.steps)
        print("\n| kernels | measured GPU ms a step | bound today, ms |")
        print("|---|---:|---:|")
        for kind in sorted(set(measured) | set(by_kind)):
            print(f"| {kind} | {measured[kind] * 1e3:.3f} | {by_kind[kind] * 1e3:.3f} |")


if __name__ == "__main__":
    main()
