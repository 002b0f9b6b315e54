#!/usr/bin/env python3
"""The RTX 5090 guide's PyTorch training recipe, as its text writes it: the baseline for ltrain.

    python3 scripts/pytorch/guides/guide_5090.py --data DATA_ROOT [--epochs 100] [--seed 0] [--json OUT]
        [--as-written] [--device cpu [--compile]]

From the guide's code block, unchanged: torch.backends.cuda.matmul.allow_tf32 = True; CIFAR-10
train set with transforms.ToTensor() only; DataLoader(batch_size=256, pin_memory=True,
num_workers=4) with no shuffle argument, so every epoch sees the same order; torchvision's
resnet50() (1000 outputs) .cuda(); torch.compile(model); a GradScaler; SGD(lr=0.1) (no momentum,
no weight decay); 100 epochs of fp16 autocast, cross_entropy, scaler.scale(loss).backward(),
scaler.step(optimizer), scaler.update().

The guide's loop never calls optimizer.zero_grad(), so each backward adds to the gradients left
by every step before it. By default this script runs the recipe as meant, with
optimizer.zero_grad(set_to_none=True) after each step (recipe_variant "as meant"); --as-written
runs the text literally, without it ("as written"). What the literal text does follows from
GradScaler: scaler.step() unscales .grad in place, so the carried sum is divided by the loss
scale again at every later step (a carry-over of 1/scale, 2^-16 at the start) while no step
overflows; once one step has inf/NaN gradients (which the scaler skips), they stay in .grad and
every later step is skipped too. Without a scaler (--device cpu) the gradients are the plain sum
over every step since the start.

Changes that are not the guide's code: CIFAR-10 comes from the local binary files instead of
download=True (cifar10_binary.py); AMP is spelled torch.autocast('cuda', dtype=torch.float16) and
torch.amp.GradScaler('cuda'), the same classes as the guide's spellings; inputs move with
.to(device), which on CUDA is the guide's .cuda(); the epoch clock, the loss sum and the test pass
around the loop are in common.py. --device cpu is a smoke test only: no autocast, no GradScaler,
and no torch.compile unless --compile.
"""
import time

STARTED = time.perf_counter()  # script_seconds counts from here, before torch's import

import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision import transforms  # noqa: E402

import common  # noqa: E402
from cifar10_binary import CIFAR10Binary  # noqa: E402

EPOCHS, BATCH_SIZE, WORKERS, LR = 100, 256, 4, 0.1
SETTINGS = ("resnet50 (1000 outputs), torch.compile, batch 256, no shuffle, pin_memory, 4 workers, ToTensor only, "
            "SGD lr 0.1, fp16 autocast + GradScaler, TF32 matmul")


def train(args):
    variant = "as written" if args.as_written else "as meant"
    zero_grad = "no zero_grad" if args.as_written else "zero_grad after each step"
    if args.compile and not hasattr(torch, "compile"):
        raise common.UsageError(f"--compile: torch {torch.__version__} has no torch.compile (2.0 or later has)")
    run = common.Run("5090", variant, args, BATCH_SIZE, f"{SETTINGS}, {zero_grad}",
                     test_transform=transforms.ToTensor(), started=STARTED)
    device = run.device

    torch.backends.cuda.matmul.allow_tf32 = True

    train_loader = torch.utils.data.DataLoader(
        CIFAR10Binary(args.data, train=True, transform=transforms.ToTensor()),
        batch_size=BATCH_SIZE,
        pin_memory=run.cuda,  # True on the guide's path; the CPU has nothing to pin for
        num_workers=WORKERS,
    )

    model = torchvision.models.resnet50().to(device)
    if run.cuda or args.compile:
        model = torch.compile(model)

    scaler = run.grad_scaler()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    for _ in run.epochs(train_loader):
        for inputs, targets in train_loader:
            with run.autocast():
                outputs = model(inputs.to(device))
                loss = torch.nn.functional.cross_entropy(outputs, targets.to(device))

            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if not args.as_written:
                optimizer.zero_grad(set_to_none=True)
            run.loss_sum += loss.detach()

    return run.finish(model)


if __name__ == "__main__":
    p = common.parser(__doc__.split("\n")[0], EPOCHS)
    p.add_argument("--as-written", action="store_true",
                   help="no optimizer.zero_grad(), as the guide's text (default: zero_grad after each step)")
    p.add_argument("--compile", action="store_true", help="torch.compile on the CPU too (always on CUDA)")
    arguments = p.parse_args()
    raise SystemExit(common.main(lambda: train(arguments)))
