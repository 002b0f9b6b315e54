#!/usr/bin/env python3
"""Writes the binary release of CIFAR-10 or CIFAR-100 from torchvision's Python one (the folder
`torchvision.datasets.CIFAR10(download=True)` leaves, cifar-10-batches-py, or CIFAR-100's
cifar-100-python): the same images and labels, byte for byte the official binary files, which
scripts/get-cifar10.sh and scripts/get-cifar100.sh then check as they check a download.

    python3 scripts/lib/cifar_from_python.py cifar10 SOURCE_DIR OUT_DIR
    python3 scripts/lib/cifar_from_python.py cifar100 SOURCE_DIR OUT_DIR

A record of the binary release is its label bytes (CIFAR-10: the class; CIFAR-100: the coarse
class, then the fine one), then the image's 3072 bytes, red plane, green, blue, each row-major
32x32: the Python release's rows of `data` are the same 3072 bytes. Needs numpy (the pickles hold
numpy arrays). Exit 2: usage; 3: a missing or malformed file.
"""
import os
import pickle
import sys

IMAGE_BYTES = 3 * 32 * 32
CIFAR10_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Each release: (Python file, binary file, the label keys of a record in the binary order).
RELEASES = {
    "cifar10": [(f"data_batch_{i}", f"data_batch_{i}.bin", [b"labels"]) for i in range(1, 6)]
               + [("test_batch", "test_batch.bin", [b"labels"])],
    "cifar100": [("train", "train.bin", [b"coarse_labels", b"fine_labels"]),
                 ("test", "test.bin", [b"coarse_labels", b"fine_labels"])],
}


def convert(source_file, out_file, label_keys):
    """One pickled batch as binary records; ValueError on a batch of another shape."""
    import numpy as np  # imported here: --help and the usage errors need no numpy

    with open(source_file, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != IMAGE_BYTES:
        raise ValueError(f"{source_file}: data of shape {data.shape}, expected [N, {IMAGE_BYTES}]")
    labels = [np.asarray(batch[key], dtype=np.int64) for key in label_keys]
    for key, values in zip(label_keys, labels):
        if values.shape != (data.shape[0],) or values.min() < 0 or values.max() > 255:
            raise ValueError(f"{source_file}: {key.decode()} do not give one byte-sized label per image")
    records = np.concatenate([values.astype(np.uint8)[:, None] for values in labels] + [data], axis=1)
    records.tofile(out_file)
    return data.shape[0]


def main(argv):
    if len(argv) != 3 or argv[0] not in RELEASES:
        print(__doc__, file=sys.stderr)
        return 2
    release, source, out = argv
    os.makedirs(out, exist_ok=True)
    try:
        for python_name, binary_name, label_keys in RELEASES[release]:
            count = convert(os.path.join(source, python_name), os.path.join(out, binary_name), label_keys)
            print(f"cifar_from_python: {binary_name}: {count} records")
        if release == "cifar10":
            with open(os.path.join(out, "batches.meta.txt"), "w") as f:
                f.write("\n".join(CIFAR10_LABELS) + "\n\n")  # as the binary release writes it
        else:
            with open(os.path.join(source, "meta"), "rb") as f:
                meta = pickle.load(f, encoding="bytes")
            for key in (b"coarse_label_names", b"fine_label_names"):
                with open(os.path.join(out, key.decode() + ".txt"), "w") as f:
                    f.write("".join(name.decode() + "\n" for name in meta[key]))
    except (OSError, ValueError, KeyError, pickle.UnpicklingError, EOFError) as exc:
        print(f"cifar_from_python: {exc!r}" if isinstance(exc, KeyError) else f"cifar_from_python: {exc}",
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
