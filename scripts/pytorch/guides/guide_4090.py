#!/usr/bin/env python3
"""The RTX 4090 guide's PyTorch training recipe (its last code block), as written: a baseline for ltrain.

    python3 scripts/pytorch/guides/guide_4090.py --data DATA_ROOT [--epochs 100] [--batch-size 256] [--seed 0]
        [--json OUT] [--device cpu]

From the guide's code, unchanged: torchvision's resnet50() (1000 outputs) .cuda(); SGD(lr=0.1) (no
momentum, no weight decay); 100 epochs, model.train() at each epoch's start; inputs.cuda(),
labels.cuda(); fp16 autocast; criterion = nn.CrossEntropyLoss(); a GradScaler (from the guide's AMP
snippet, which the last block uses without defining); scaler.scale(loss).backward(),
scaler.step(optimizer), scaler.update(), then optimizer.zero_grad().

The guide gives no train_loader. Chosen here, and nothing more: the CIFAR-10 train set with
transforms.ToTensor() only (as the 5090 guide's loader), batch size 256 (--batch-size; the batch
for which lr 0.1 is the usual ImageNet reference setting, and the 5090 guide's too), shuffle=True,
and DataLoader's other defaults (num_workers 0, no pin_memory).

Changes that are not the guide's code: CIFAR-10 comes from the local binary files
(cifar10_binary.py); torch.cuda.amp.autocast() and GradScaler() are spelled
torch.autocast('cuda', dtype=torch.float16) and torch.amp.GradScaler('cuda'), which the old
spellings call (they now warn); .to(device) is .cuda() on the GPU path; the epoch clock, the loss
sum and the test pass around the loop are in common.py. --device cpu is a smoke test only (no
autocast, no GradScaler).
"""
import time

STARTED = time.perf_counter()  # script_seconds counts from here, before torch's import

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision import transforms  # noqa: E402

import common  # noqa: E402
from cifar10_binary import CIFAR10Binary  # noqa: E402

EPOCHS, BATCH_SIZE, LR = 100, 256, 0.1
SETTINGS = ("resnet50 (1000 outputs), batch {batch} (the guide gives no loader), shuffle, 0 workers, ToTensor only, "
            "SGD lr 0.1, fp16 autocast + GradScaler, zero_grad after each step")


def train(args):
    if args.batch_size < 1:
        raise common.UsageError(f"--batch-size {args.batch_size}: give 1 or more")
    run = common.Run("4090", "as written", args, args.batch_size, SETTINGS.format(batch=args.batch_size),
                     test_transform=transforms.ToTensor(), started=STARTED)
    device = run.device

    train_loader = DataLoader(CIFAR10Binary(args.data, train=True, transform=transforms.ToTensor()),
                              batch_size=args.batch_size, shuffle=True)
    criterion = nn.CrossEntropyLoss()
    scaler = run.grad_scaler()

    model = torchvision.models.resnet50().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    for _ in run.epochs(train_loader):
        model.train()
        for inputs, labels in train_loader:
            inputs, labels = inputs.to(device), labels.to(device)

            with run.autocast():
                outputs = model(inputs)
                loss = criterion(outputs, labels)

            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            run.loss_sum += loss.detach()

    return run.finish(model)


if __name__ == "__main__":
    p = common.parser(__doc__.split("\n")[0], EPOCHS)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                   help=f"the guide gives no loader (default {BATCH_SIZE}, as the 5090 guide's with lr 0.1)")
    arguments = p.parse_args()
    raise SystemExit(common.main(lambda: train(arguments)))
