#!/usr/bin/env python3
"""Writes the binary release of CIFAR-10 or CIFAR-100 from torchvision's Python one (the folder
`torchvision.datasets.CIFAR10(download=True)` leaves, cifar-10-batches-py, or CIFAR-100's
cifar-100-python): the same images and labels as the binary files, byte for byte the official ones
where the folder is the official release, which scripts/get-cifar10.sh and scripts/get-cifar100.sh
then check as they check a download.

    python3 scripts/lib/cifar_from_python.py cifar10 SOURCE_DIR OUT_DIR
    python3 scripts/lib/cifar_from_python.py cifar100 SOURCE_DIR OUT_DIR

A record of the binary release is its label bytes (CIFAR-10: the class; CIFAR-100: the coarse
class, then the fine one), then the image's 3072 bytes, red plane, green, blue, each row-major
32x32: the Python release's rows of `data` are the same 3072 bytes. The pickles hold numpy arrays,
named by the module of the numpy that wrote them: numpy.core (the official release, numpy 1) or
numpy._core (a folder pickled again under numpy 2); either is read under numpy 1 and 2. A batch is
well-formed when its data is N rows of 3072 bytes and it has one label per row within the release's
classes. Prints one line per file written (its records). Needs numpy.
Exit 2: usage; 3: a missing or malformed file.
"""
import os
import pickle
import sys

IMAGE_BYTES = 3 * 32 * 32
CIFAR10_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Each release: (Python file, binary file, the label keys of a record in the binary order, each
# key's number of classes).
RELEASES = {
    "cifar10": [(f"data_batch_{i}", f"data_batch_{i}.bin", [(b"labels", 10)]) for i in range(1, 6)]
               + [("test_batch", "test_batch.bin", [(b"labels", 10)])],
    "cifar100": [("train", "train.bin", [(b"coarse_labels", 20), (b"fine_labels", 100)]),
                 ("test", "test.bin", [(b"coarse_labels", 20), (b"fine_labels", 100)])],
}


class NumpyEitherVersion(pickle.Unpickler):
    """An unpickler that finds numpy's array reconstruction under the module name of this numpy:
    numpy 2 moved numpy.core to numpy._core, and a pickle names the one of the numpy that wrote it
    (numpy 1 has no numpy._core; numpy 2 keeps numpy.core as a deprecated alias)."""

    def find_class(self, module, name):
        if module == "numpy.core" or module.startswith(("numpy.core.", "numpy._core")):
            import numpy  # noqa: F401  (numpy's own modules below)

            suffix = module.split(".", 2)[2] if module.count(".") >= 2 else ""
            for package in ("numpy._core", "numpy.core"):
                candidate = package + ("." + suffix if suffix else "")
                try:
                    __import__(candidate)
                except ImportError:
                    continue
                return super().find_class(candidate, name)
        return super().find_class(module, name)


def load_pickle(path):
    with open(path, "rb") as f:
        return NumpyEitherVersion(f, encoding="bytes").load()


def convert(source_file, out_file, label_keys):
    """One pickled batch as binary records; ValueError on a batch that is not well-formed."""
    import numpy as np  # imported here: --help and the usage errors need no numpy

    batch = load_pickle(source_file)
    if not isinstance(batch, dict) or b"data" not in batch:
        raise ValueError(f"{source_file}: no 'data' in it: not a batch of torchvision's Python release")
    data = np.asarray(batch[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != IMAGE_BYTES:
        raise ValueError(f"{source_file}: data of shape {list(data.shape)} and type {data.dtype}, "
                         f"expected [N, {IMAGE_BYTES}] bytes")
    columns = []
    for key, classes in label_keys:
        if key not in batch:
            raise KeyError(f"{source_file}: no '{key.decode()}' in it")
        values = np.asarray(batch[key])
        if values.shape != (data.shape[0],) or values.dtype.kind not in "iu":
            raise ValueError(f"{source_file}: '{key.decode()}' are not {data.shape[0]} whole numbers, one per image")
        if data.shape[0] and (values.min() < 0 or values.max() >= classes):
            raise ValueError(f"{source_file}: '{key.decode()}' has {values.max() if values.max() >= classes else values.min()}, "
                             f"outside 0-{classes - 1}")
        columns.append(values.astype(np.uint8)[:, None])
    np.concatenate(columns + [data], axis=1).tofile(out_file)
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
            meta = load_pickle(os.path.join(source, "meta"))
            for key in (b"coarse_label_names", b"fine_label_names"):
                with open(os.path.join(out, key.decode() + ".txt"), "w") as f:
                    f.write("".join(name.decode() + "\n" for name in meta[key]))
    except KeyError as exc:
        print(f"cifar_from_python: {exc.args[0] if exc.args and isinstance(exc.args[0], str) else repr(exc)}",
              file=sys.stderr)
        return 3
    except (OSError, ValueError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as exc:
        print(f"cifar_from_python: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
