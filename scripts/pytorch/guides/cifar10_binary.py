#!/usr/bin/env python3
"""CIFAR-10 from the local binary files, as a Dataset that behaves like torchvision.datasets.CIFAR10.

The guides load CIFAR-10 with `torchvision.datasets.CIFAR10(..., download=True)`; the GPU host has
no network, so this reads the binary release instead (data_batch_1..5.bin, test_batch.bin: each
record is 1 label byte, then 3072 pixel bytes: 1024 red, 1024 green, 1024 blue, each plane
row-major 32x32). Items are (PIL.Image RGB, int label), made the way torchvision makes them, so a
guide's torchvision transforms apply unchanged. Each file is read once into memory.

Check a data root (prints the record counts; exit 3 if a file is missing or malformed):

    python3 scripts/pytorch/guides/cifar10_binary.py /work/shared/data/cifar10-mini
"""
import os
import sys

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
SIDE = 32
RECORD_BYTES = 1 + 3 * SIDE * SIDE


class MissingDataError(Exception):
    """A CIFAR-10 binary file is missing or is not a whole number of records."""


def read_records(path):
    """(images [N,32,32,3] uint8 HWC, labels list of int) from one binary file."""
    if not os.path.isfile(path):
        raise MissingDataError(f"{path} does not exist: point --data at the folder with "
                               f"{', '.join(TRAIN_FILES + TEST_FILES)} (cifar-10-batches-bin)")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise MissingDataError(f"{path}: {raw.size} bytes is not a whole number of "
                               f"{RECORD_BYTES}-byte CIFAR-10 records")
    records = raw.reshape(-1, RECORD_BYTES)
    # [N,3,32,32] planes -> [N,32,32,3], the layout torchvision's CIFAR10 keeps in .data
    images = records[:, 1:].reshape(-1, 3, SIDE, SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), [int(label) for label in records[:, 0]]


class CIFAR10Binary(Dataset):
    """CIFAR-10 train (50,000) or test (10,000) images; `data` and `targets` as torchvision has them."""

    def __init__(self, root, train=True, transform=None, target_transform=None):
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        parts = [read_records(os.path.join(root, name)) for name in (TRAIN_FILES if train else TEST_FILES)]
        self.data = np.concatenate([images for images, _ in parts])
        self.targets = [label for _, labels in parts for label in labels]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        image = Image.fromarray(self.data[index])  # [32,32,3] uint8 -> RGB
        target = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


def main(argv):
    if len(argv) != 1:
        print("usage: cifar10_binary.py DATA_ROOT", file=sys.stderr)
        return 2
    try:
        train, test = CIFAR10Binary(argv[0], train=True), CIFAR10Binary(argv[0], train=False)
    except MissingDataError as exc:
        print(f"cifar10_binary: {exc}", file=sys.stderr)
        return 3
    print(f"{argv[0]}: {len(train)} train, {len(test)} test records; "
          f"train labels per class {np.bincount(train.targets, minlength=10).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
