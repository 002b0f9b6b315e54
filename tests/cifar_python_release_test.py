#!/usr/bin/env python3
"""scripts/get-cifar10.sh --from torchvision's Python release of CIFAR-10 (cifar-10-batches-py):
the release is made here, as torchvision's download leaves it, from the real binary files of the
shared data copy, and the script must turn it back into the official files, which it checks by
their published SHA-256. A release of other content fails that check (exit 3) and installs
nothing. Without the shared copy ($LTRAIN_SHARED_DATA, default ../shared/data beside the checkout)
it exits 77 (skipped).

    python3 tests/cifar_python_release_test.py
"""
import glob
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("LTRAIN_SHARED_DATA") or os.path.join(REPO_ROOT, "..", "shared", "data")
BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_python_release(binary_dir, out_dir):
    """torchvision's layout: each batch a pickled dict of bytes keys, data a uint8 [N,3072] array."""
    os.makedirs(out_dir)
    for name in BATCHES:
        records = np.fromfile(os.path.join(binary_dir, name + ".bin"), dtype=np.uint8).reshape(-1, 3073)
        batch = {b"batch_label": name.encode(), b"labels": records[:, 0].astype(int).tolist(),
                 b"data": records[:, 1:].copy(), b"filenames": [b"image.png"] * len(records)}
        with open(os.path.join(out_dir, name), "wb") as f:
            pickle.dump(batch, f)
    with open(os.path.join(out_dir, "batches.meta"), "wb") as f:
        pickle.dump({b"num_cases_per_batch": 10000, b"label_names": [b"airplane"], b"num_vis": 3072}, f)


def get_cifar10(dest, source):
    return subprocess.run(["bash", os.path.join(REPO_ROOT, "scripts", "get-cifar10.sh"), "--dest", dest, "--from", source],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
                          env=dict(os.environ, LTRAIN_PYTHON=sys.executable))


def main():
    parts = sorted(glob.glob(os.path.join(SHARED, "cifar-10", "cifar-10-binary.tar.xz.part*")))
    if not parts:
        print(f"cifar_python_release_test: no shared CIFAR-10 in {SHARED}: skipped")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(f"cat {' '.join(parts)} | xz -dc | tar -x -C '{work}'", shell=True, check=True)
        python_release = os.path.join(work, "cifar-10-batches-py")
        write_python_release(os.path.join(work, "cifar-10-batches-bin"), python_release)

        done = get_cifar10(os.path.join(work, "out"), python_release)
        if done.returncode != 0 or "all 7 files verified" not in done.stdout:
            failures.append(f"the real release: exit {done.returncode}:\n{done.stdout}")

        # One label changed: no longer the official content.
        with open(os.path.join(python_release, "test_batch"), "rb") as f:
            batch = pickle.load(f)
        batch[b"labels"][0] = (batch[b"labels"][0] + 1) % 10
        with open(os.path.join(python_release, "test_batch"), "wb") as f:
            pickle.dump(batch, f)
        done = get_cifar10(os.path.join(work, "changed"), python_release)
        if done.returncode != 3 or "test_batch.bin is damaged (SHA-256 mismatch)" not in done.stdout:
            failures.append(f"a changed release: exit {done.returncode}, expected 3 naming test_batch.bin:\n{done.stdout}")
        if os.path.exists(os.path.join(work, "changed", "cifar-10-batches-bin")):
            failures.append("a changed release was installed")
    for failure in failures:
        print(f"cifar_python_release_test: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
