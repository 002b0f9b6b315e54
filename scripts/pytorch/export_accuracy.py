#!/usr/bin/env python3
"""Test accuracy of an `ltrain export` safetensors file in torchvision, to set beside `ltrain eval`.

    python3 scripts/pytorch/export_accuracy.py WEIGHTS.safetensors --data data/cifar-10-batches-bin \
        [--device cuda] [--json]

Builds torchvision's model from the file's metadata (model.arch, model.stem, model.num_classes,
written by `ltrain export`), loads the weights with strict=True (every name must match), and
evaluates CIFAR-10's test_batch.bin in float32, eval mode, normalized with the file's data.mean and
data.std (data.normalize false: pixels / 255 only). Prints correct / images and the accuracy.
Exit 2: usage; 3: a missing or malformed file.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

from parity_torchvision import load_tensors
from torchvision_models import build_model

IMAGE_BYTES = 3 * 32 * 32


def read_metadata(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size)).get("__metadata__", {})


def read_cifar_test(root):
    path = os.path.join(root, "test_batch.bin")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % (IMAGE_BYTES + 1):
        raise ValueError(f"{path}: not a CIFAR-10 binary batch")
    records = raw.reshape(-1, IMAGE_BYTES + 1)
    labels = torch.from_numpy(records[:, 0].astype(np.int64))
    images = torch.from_numpy(records[:, 1:].copy()).reshape(-1, 3, 32, 32)
    return images, labels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("weights")
    p.add_argument("--data", default="data/cifar-10-batches-bin", help="folder with test_batch.bin")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        meta = read_metadata(args.weights)
        tensors = load_tensors(args.weights)
        images, labels = read_cifar_test(args.data)
    except (OSError, ValueError, struct.error) as exc:
        print(f"export_accuracy: {exc}", file=sys.stderr)
        return 3
    model = build_model(meta.get("model.arch", "resnet50"), meta.get("model.stem", "imagenet"),
                        int(meta.get("model.num_classes", "10")))
    model.load_state_dict(tensors, strict=True)
    model = model.to(args.device).eval()
    normalize = meta.get("data.normalize", "true") == "true"
    mean = torch.tensor(json.loads(meta.get("data.mean", "[0,0,0]")) if normalize else [0.0, 0.0, 0.0])
    std = torch.tensor(json.loads(meta.get("data.std", "[1,1,1]")) if normalize else [1.0, 1.0, 1.0])
    mean, std = mean.view(1, 3, 1, 1).to(args.device), std.view(1, 3, 1, 1).to(args.device)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), args.batch):
            x = images[start:start + args.batch].to(args.device).float().div_(255.0)
            x = (x - mean) / std
            logits = model(x)
            correct += int((logits.argmax(1).cpu() == labels[start:start + args.batch]).sum())
    result = dict(weights=args.weights, images=len(labels), correct=correct, accuracy=correct / len(labels))
    print(json.dumps(result) if args.json else
          f"{args.weights}: torchvision test accuracy {100 * result['accuracy']:.2f}% ({correct}/{len(labels)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
