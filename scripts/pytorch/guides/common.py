"""What the guide scripts share: arguments, seeding, epoch timing, the test pass, the result JSON.

Not run by itself; the guide scripts (guide_5090.py, guide_4090.py, guide_4090d.py) import it.
Each guide script keeps its own training loop, line for line as its guide writes it, and only
wraps it: `for epoch in run.epochs(loader)` times each epoch (torch.cuda.synchronize() at the
epoch's start and end, never inside a step) and the loop body adds `run.loss_sum += loss.detach()`
(a device tensor, read once per epoch, so the mean loss costs no host sync per step).

Result JSON (--json OUT): guide, recipe_variant, seed, epochs, batch_size, epoch_seconds (list),
train_seconds (their sum), images_per_second (training images / train_seconds),
steady_images_per_second (epochs 2.. only: the first holds torch.compile's and cudnn's warm-up;
null with one epoch), epoch_loss (list), test_accuracy (fraction), peak_memory_bytes (null on the
CPU), torch_version, device_name, script_seconds (from before torch's import to the end of the
test pass), and the command line.

Exit codes: 0 ok, 2 usage, 3 missing or malformed data, 4 no CUDA device (use --device cpu for a
smoke test).
"""
import argparse
import json
import os
import platform
import random
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from cifar10_binary import CIFAR10Binary, MissingDataError

EXIT_USAGE, EXIT_DATA, EXIT_NO_CUDA = 2, 3, 4
TEST_BATCH = 1000


class UsageError(Exception):
    """A command-line combination that cannot run (exit 2)."""


class NoCudaError(Exception):
    """--device cuda on a host without a CUDA device (exit 4)."""


def parser(description, epochs):
    """The arguments every guide script takes; a script adds its own before parsing."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", required=True, metavar="ROOT",
                   help="folder with CIFAR-10's data_batch_1..5.bin and test_batch.bin")
    p.add_argument("--epochs", type=int, default=epochs, help=f"epochs to train (default {epochs}, the guide's)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds torch, random and numpy (the guide sets none; this only makes runs repeatable)")
    p.add_argument("--json", metavar="OUT", help="write the result JSON here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: the guide's code path; cpu: a smoke test (no fp16 autocast, no GradScaler)")
    return p


def main(body):
    """Runs body() and maps the user errors to one stderr line and their exit codes."""
    try:
        return body()
    except UsageError as exc:
        code, message = EXIT_USAGE, exc
    except MissingDataError as exc:
        code, message = EXIT_DATA, exc
    except NoCudaError as exc:
        code, message = EXIT_NO_CUDA, exc
    print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr)
    return code


class Run:
    """One guide run: device, seeding, epoch clock, test pass and result, around the guide's loop."""

    def __init__(self, guide, variant, args, batch_size, settings, test_transform, started):
        if args.epochs < 1:
            raise UsageError(f"--epochs {args.epochs}: give 1 or more")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise NoCudaError("no CUDA device here (torch.cuda.is_available() is False); "
                              "the guide's recipe needs one, use --device cpu only for a smoke test")
        self.guide, self.variant, self.args, self.batch_size = guide, variant, args, batch_size
        self.started = started
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        np.random.seed(args.seed)
        # Read now, so that a missing test file stops the run before training, not after it.
        self.test_set = CIFAR10Binary(args.data, train=False, transform=test_transform)
        self.epoch_seconds, self.epoch_loss = [], []
        self.images_per_epoch = 0
        self.loss_sum = None
        print(f"{guide} guide's recipe, {variant}: {settings}; {args.epochs} epochs, seed {args.seed}, "
              f"{self.device_name()}, torch {torch.__version__}", flush=True)
        if not self.cuda:
            print("smoke test on the CPU, not the guide's code path: no fp16 autocast, no GradScaler", flush=True)

    def autocast(self):
        """The guide's fp16 autocast on CUDA; on the CPU (smoke test) autocast is off."""
        if self.cuda:
            return torch.autocast("cuda", dtype=torch.float16)
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)

    def grad_scaler(self):
        """The guide's GradScaler on CUDA (torch.amp's spelling, same class); disabled on the CPU."""
        if hasattr(torch.amp, "GradScaler"):  # torch 2.3 and later
            return torch.amp.GradScaler("cuda", enabled=self.cuda)
        return torch.cuda.amp.GradScaler(enabled=self.cuda)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def epochs(self, loader):
        """Yields 0..epochs-1; times each epoch between two syncs and prints its line."""
        self.images_per_epoch = len(loader.dataset)
        steps = len(loader)
        for epoch in range(self.args.epochs):
            self.loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
            self.sync()
            start = time.perf_counter()
            yield epoch
            self.sync()
            seconds = time.perf_counter() - start
            self.epoch_seconds.append(seconds)
            self.epoch_loss.append(self.loss_sum.item() / steps)
            print(f"epoch {epoch + 1}/{self.args.epochs}: {seconds:.2f} s, "
                  f"{self.images_per_epoch / seconds:.0f} img/s, loss {self.epoch_loss[-1]:.4f}", flush=True)

    def evaluate(self, model):
        """Test-set accuracy (fraction) with the recipe's test-time transform and its autocast.

        A torch.compile'd model is evaluated through its original module (the same parameters):
        the guides have no test pass, and compiling one would add its compile time to the run.
        """
        model = getattr(model, "_orig_mod", model)
        loader = DataLoader(self.test_set, batch_size=TEST_BATCH)
        model.eval()
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        with torch.no_grad():
            for inputs, labels in loader:
                inputs, labels = inputs.to(self.device), labels.to(self.device)
                with self.autocast():
                    outputs = model(inputs)
                correct += (outputs.argmax(dim=1) == labels).sum()
        return correct.item() / len(self.test_set)

    def finish(self, model):
        """Test pass, final line, result JSON; returns 0."""
        accuracy = self.evaluate(model)
        script_seconds = time.perf_counter() - self.started
        print(f"test accuracy {100 * accuracy:.2f}%", flush=True)
        if self.args.json:
            write_json(self.args.json, self.result(accuracy, script_seconds))
        return 0

    def result(self, accuracy, script_seconds):
        train_seconds = sum(self.epoch_seconds)
        steady = self.epoch_seconds[1:]
        return {
            "guide": self.guide,
            "recipe_variant": self.variant,
            "seed": self.args.seed,
            "epochs": self.args.epochs,
            "batch_size": self.batch_size,
            "epoch_seconds": self.epoch_seconds,
            "train_seconds": train_seconds,
            "images_per_second": self.images_per_epoch * len(self.epoch_seconds) / train_seconds,
            "steady_images_per_second": self.images_per_epoch * len(steady) / sum(steady) if steady else None,
            "epoch_loss": self.epoch_loss,
            "test_accuracy": accuracy,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if self.cuda else None,
            "torch_version": torch.__version__,
            "device_name": self.device_name(),
            "script_seconds": script_seconds,
            "train_images": self.images_per_epoch,
            "test_images": len(self.test_set),
            "command": " ".join(sys.argv),
        }

    def device_name(self):
        if self.cuda:
            return torch.cuda.get_device_name(self.device)
        return f"CPU ({platform.processor() or platform.machine()})"


def write_json(path, result):
    """Writes the result to a temporary name and renames it, so a killed run leaves no half file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(temporary, path)
