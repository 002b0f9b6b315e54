#!/usr/bin/env python3
"""The RTX 4090D guide's PyTorch training recipe, as its text writes it: the baseline for ltrain.

    python3 scripts/pytorch/guides/guide_4090d.py --data DATA_ROOT [--epochs 10] [--seed 0] [--json OUT] [--device cpu]

From the guide's "PyTorch configuration" and training code, unchanged: torch.backends.cudnn.benchmark,
cudnn.allow_tf32 and cuda.matmul.allow_tf32 all True; a GradScaler; the CIFAR-10 train set with
Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]); DataLoader(dataset,
batch_size=512, shuffle=True) with its other defaults (num_workers 0, no pin_memory; the guide
recommends pin_memory=True in its tips, but its code does not use it); resnet50(pretrained=False)
(1000 outputs) .cuda(); AdamW(lr=0.001) (its default weight decay 0.01); 10 epochs of fp16
autocast, F.cross_entropy, scaler.scale(loss).backward(), scaler.step(optimizer),
scaler.update(), then optimizer.zero_grad().

Changes that are not the guide's code: CIFAR-10 comes from the local binary files
(cifar10_binary.py); resnet50(pretrained=False) is spelled resnet50(weights=None), the same
untrained model; torch.cuda.amp.autocast() and GradScaler() are spelled
torch.autocast('cuda', dtype=torch.float16) and torch.amp.GradScaler('cuda'), the same classes;
.to(device) is .cuda() on the GPU path; the epoch clock, the loss sum and the test pass (with the
recipe's ToTensor + Normalize) around the loop are in common.py. --device cpu is a smoke test only
(no autocast, no GradScaler).
"""
import time

STARTED = time.perf_counter()  # script_seconds counts from here, before torch's import

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import common  # noqa: E402
from cifar10_binary import CIFAR10Binary  # noqa: E402

EPOCHS, BATCH_SIZE, LR = 10, 512, 0.001
SETTINGS = ("resnet50 (1000 outputs), batch 512, shuffle, 0 workers, ToTensor + Normalize(0.5, 0.5), "
            "AdamW lr 0.001, fp16 autocast + GradScaler, cudnn.benchmark, TF32 (cudnn and matmul), "
            "zero_grad after each step")


def train(args):
    transform = torchvision.transforms.Compose([
        torchvision.transforms.ToTensor(),
        torchvision.transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ])
    run = common.Run("4090D", "as written", args, BATCH_SIZE, SETTINGS, test_transform=transform, started=STARTED)
    device = run.device

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True

    scaler = run.grad_scaler()

    dataset = CIFAR10Binary(args.data, train=True, transform=transform)
    dataloader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)

    model = torchvision.models.resnet50(weights=None).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    for _ in run.epochs(dataloader):
        for inputs, labels in dataloader:
            inputs, labels = inputs.to(device), labels.to(device)

            with run.autocast():
                outputs = model(inputs)
                loss = torch.nn.functional.cross_entropy(outputs, labels)

            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            run.loss_sum += loss.detach()

    return run.finish(model)


if __name__ == "__main__":
    arguments = common.parser(__doc__.split("\n")[0], EPOCHS).parse_args()
    raise SystemExit(common.main(lambda: train(arguments)))
