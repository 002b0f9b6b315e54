#!/usr/bin/env python3
"""Test accuracy of an `ltrain export` safetensors file in torchvision, to set beside `ltrain eval`.

    python3 scripts/pytorch/export_accuracy.py WEIGHTS.safetensors [--data DATA_ROOT] \
        [--device cuda] [--json] [--dry-run]

Builds torchvision's model from the file's metadata (model.arch, model.stem, model.num_classes,
written by `ltrain export`), loads the weights with strict=True (every name must match), and
evaluates the test set of the data the model was trained on (the metadata's data.source):
CIFAR-10's test_batch.bin, or CIFAR-100's test.bin with the label the run trained on
(data.cifar100_labels: the fine label byte, or the coarse one). In float32, eval mode, normalized
with the file's data.mean and data.std (data.normalize false: pixels / 255 only). Prints correct /
images and the accuracy. --data defaults to the source's folder (data/cifar-10-batches-bin,
data/cifar-100-binary). --dry-run reads the metadata and the test set, prints what would be
evaluated (as JSON) and stops; it needs numpy only, not torch.
Exit 2: usage; 3: a missing or malformed file.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

IMAGE_BYTES = 3 * 32 * 32

# Per data.source: the test file, the default folder, and the label bytes that open each record
# (name -> (position, classes)).
TEST_SETS = {
    "cifar10": ("test_batch.bin", "data/cifar-10-batches-bin", {"label": (0, 10)}),
    "cifar100": ("test.bin", "data/cifar-100-binary", {"coarse": (0, 20), "fine": (1, 100)}),
}


def read_metadata(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size)).get("__metadata__", {})


def test_set_of(meta):
    """(source, label name) of the data the exported model was trained on; older files are CIFAR-10's."""
    source = meta.get("data.source", "cifar10")
    if source not in TEST_SETS:
        raise ValueError(f"data.source {source!r} in the file's metadata has no test set here "
                         f"(expected one of {', '.join(TEST_SETS)})")
    label = meta.get("data.cifar100_labels", "fine") if source == "cifar100" else "label"
    if label not in TEST_SETS[source][2]:
        raise ValueError(f"data.cifar100_labels {label!r} in the file's metadata: expected fine or coarse")
    return source, label


def read_test_set(root, source, label):
    """uint8 images [N,3,32,32] and int64 labels [N] (numpy) of `source`'s test file under `root`."""
    name, _, label_bytes = TEST_SETS[source]
    position, classes = label_bytes[label]
    path = os.path.join(root, name)
    record_bytes = len(label_bytes) + IMAGE_BYTES
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % record_bytes:
        raise ValueError(f"{path}: {raw.size} bytes is not a whole number of {record_bytes}-byte records of "
                         f"{source}'s binary release")
    records = raw.reshape(-1, record_bytes)
    for other, (at, limit) in label_bytes.items():
        bad = np.flatnonzero(records[:, at] >= limit)
        if bad.size:
            raise ValueError(f"{path}: record {bad[0]} has {other} label {records[bad[0], at]} "
                             f"(expected 0-{limit - 1}): not {source}'s binary release")
    labels = records[:, position].astype(np.int64)
    images = records[:, len(label_bytes):].reshape(-1, 3, 32, 32)
    return path, images, labels, classes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("weights")
    p.add_argument("--data", help="folder with the test file (default: the source's folder)")
    p.add_argument("--device", help="torch device (default: cuda where available, else cpu)")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="read the metadata and the test set, print what "
                   "would be evaluated as JSON, and stop (no torch needed)")
    args = p.parse_args(argv)
    try:
        meta = read_metadata(args.weights)
        source, label = test_set_of(meta)
        path, images, labels, classes = read_test_set(args.data or TEST_SETS[source][1], source, label)
    except (OSError, ValueError, struct.error) as exc:
        print(f"export_accuracy: {exc}", file=sys.stderr)
        return 3
    num_classes = int(meta.get("model.num_classes", "10"))
    if num_classes < classes:
        print(f"export_accuracy: {args.weights}: model.num_classes {num_classes} is fewer than {source}'s "
              f"{classes} {label} classes", file=sys.stderr)
        return 3
    if args.dry_run:
        print(json.dumps(dict(weights=args.weights, source=source, labels=label, classes=classes, file=path,
                              images=len(labels), first_labels=labels[:8].tolist())))
        return 0

    if meta.get("model.width", "64") != "64":
        print(f"export_accuracy: {args.weights}: model.width {meta['model.width']}: torchvision's ResNets have "
              "width 64 only, so no torchvision model takes these weights", file=sys.stderr)
        return 3
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from torchvision_models import build_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tensors = load_file(args.weights)
    except (OSError, ValueError, SafetensorError) as exc:
        print(f"export_accuracy: {exc}", file=sys.stderr)
        return 3
    model = build_model(meta.get("model.arch", "resnet50"), meta.get("model.stem", "imagenet"), num_classes)
    model.load_state_dict(tensors, strict=True)
    model = model.to(device).eval()
    images, labels = torch.from_numpy(images.copy()), torch.from_numpy(labels)
    normalize = meta.get("data.normalize", "true") == "true"
    mean = torch.tensor(json.loads(meta.get("data.mean", "[0,0,0]")) if normalize else [0.0, 0.0, 0.0])
    std = torch.tensor(json.loads(meta.get("data.std", "[1,1,1]")) if normalize else [1.0, 1.0, 1.0])
    mean, std = mean.view(1, 3, 1, 1).to(device), std.view(1, 3, 1, 1).to(device)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(labels), args.batch):
            x = images[start:start + args.batch].to(device).float().div_(255.0)
            x = (x - mean) / std
            logits = model(x).cpu()                      # [B,classes] float32
            y = labels[start:start + args.batch]         # [B] int64
            correct += int((logits.argmax(1) == y).sum())
            loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
    result = dict(weights=args.weights, source=source, labels=label, images=len(labels), correct=correct,
                  accuracy=correct / len(labels), loss=loss_sum / len(labels))
    on = f"{source} ({label} labels)" if source == "cifar100" else source
    print(json.dumps(result) if args.json else
          f"{args.weights}: torchvision test accuracy {100 * result['accuracy']:.2f}% ({correct}/{len(labels)}), "
          f"loss {result['loss']:.4f} on {on}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
