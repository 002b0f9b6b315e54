#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel beside ltrain's data-parallel step: torchvision's ResNet trained
on every process torchrun starts, with the best settings PyTorch offers for it, timed.

    torchrun --nproc-per-node 2 scripts/pytorch/ddp_baseline.py --arch resnet50 --stem imagenet \
        --batch 512 --precision fp16 --steps 100 --warmup 20 [--graph] --json OUT.json

Each process trains on --batch images (the global batch is --batch x processes), synthetic
32x32 images on its device, the recipe ltrain's step benchmark runs (SGD lr 0.01, momentum 0.9,
weight decay 5e-4, cross-entropy, 10 classes). The settings: autocast (fp16 with a GradScaler,
bf16 without), channels_last, cudnn.benchmark, DDP with gradient_as_bucket_view and static_graph;
with --graph the whole step (forward, loss, backward with DDP's all-reduces, SGD step) is captured
in one CUDA graph, as PyTorch's CUDA graphs notes show for DDP (fp16 then runs without the
GradScaler, whose step is not capturable), and where the capture fails the eager step is timed
and the failure is recorded. --device cpu runs the same with Gloo (the test suite's check).

Rank 0 prints one JSON line (and writes it to --json): processes, batch per process, global
img/s (all processes' images over the slowest rank's time), ms per step, the mode that ran.
Exit 2: usage.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from torchvision_models import ARCHS, NUM_CLASSES, build_model

IMAGE_SIZE = 32
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--arch", default="resnet50", choices=ARCHS)
    p.add_argument("--stem", default="imagenet", choices=("imagenet", "cifar"))
    p.add_argument("--batch", type=int, default=512, help="images per process and step")
    p.add_argument("--precision", default="fp16", choices=PRECISIONS)
    p.add_argument("--steps", type=int, default=100, help="timed steps")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before them")
    p.add_argument("--graph", action="store_true", help="capture the whole step in one CUDA graph")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--json", metavar="OUT", help="also write rank 0's line here")
    args = p.parse_args(argv)
    if args.batch < 2 or args.steps < 1 or args.warmup < 0:
        p.error("--batch must be >= 2, --steps >= 1, --warmup >= 0")
    if args.device == "cpu" and (args.graph or args.precision in ("fp16", "tf32")):
        p.error("--device cpu runs fp32 or bf16 eager steps only")
    return args


class Step:
    """One training step of `model` (DDP-wrapped) on fixed input buffers, eager or replayed."""

    def __init__(self, model, args, device):
        self.model, self.args = model, args
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
        self.device_type = device.type
        self.images = torch.randn(args.batch, 3, IMAGE_SIZE, IMAGE_SIZE, device=device).contiguous(
            memory_format=torch.channels_last)                                      # [B,3,32,32] float32
        self.labels = torch.randint(0, NUM_CLASSES, (args.batch,), device=device)  # [B] int64
        use_scaler = args.precision == "fp16" and not args.graph
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.graph = None
        self.failure = ""

    def eager(self, cache_enabled=True):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device_type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None, cache_enabled=cache_enabled):
            loss = self.criterion(self.model(self.images), self.labels)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()

    def capture(self):
        """The whole step in one CUDA graph after warm-up on a side stream; False, recording why,
        where the capture fails (the eager step is then timed)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.eager(cache_enabled=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                self.eager(cache_enabled=False)
        except RuntimeError as error:
            self.failure = str(error).splitlines()[0][:200]
            torch.cuda.synchronize()
            return False
        self.graph = graph
        return True

    def __call__(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.eager()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", device_id=device if args.device == "cuda"
                            else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)

    model = build_model(args.arch, args.stem).to(device=device, memory_format=torch.channels_last).train()
    model = DistributedDataParallel(model, device_ids=[local_rank] if args.device == "cuda" else None,
                                    gradient_as_bucket_view=True, static_graph=True)
    step = Step(model, args, device)
    mode = "eager"
    if args.graph:
        mode = "graph" if step.capture() else "eager (capture failed)"
    for _ in range(args.warmup):
        step()
    synchronize(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    synchronize(device)
    seconds = time.perf_counter() - started
    # The slowest rank's time: every rank's images are done only then.
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    if rank == 0:
        line = dict(tool="pytorch-ddp", arch=args.arch, stem=args.stem, precision=args.precision, processes=world,
                    batch_per_process=args.batch, global_batch=args.batch * world, steps=args.steps, mode=mode,
                    seconds=seconds, ms_per_step=1000 * seconds / args.steps,
                    images_per_second=args.batch * world * args.steps / seconds, torch=torch.__version__,
                    device=torch.cuda.get_device_name(device) if args.device == "cuda" else "cpu")
        if step.failure:
            line["capture_failure"] = step.failure
        print(json.dumps(line), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                f.write(json.dumps(line) + "\n")
    # Every rank leaves together, once the results are written, and at once: tearing down a Gloo
    # group and the interpreter after it (Gloo's threads, the process group's destructors) was seen
    # to keep a finished rank alive for minutes on a loaded machine. Nothing is left to clean up
    # that the end of the process does not release.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
