#!/usr/bin/env python3
"""scripts/get-cifar10.sh and get-cifar100.sh --from a made-up Python release (torchvision's
layout, a few records per batch): pickled as numpy 1 writes it (its arrays under numpy.core), as
numpy 2 does (numpy._core) and with pickle's newest protocol, each converted under every Python at
hand with numpy (the project's environment, Debian's /usr/bin/python3: numpy 2 and 1). Such a folder
is well-formed but not the official release: one line says so, and its files are installed as they
are, byte for byte its records, with SOURCE and SHA256SUMS; a second run keeps it. A batch of the
wrong shape or with a label outside the classes is refused (exit 3) and installs nothing.
With LTRAIN_REQUIRE_PYTHON_CHECKS=1 (CI) both numpy 1 and numpy 2 must be among the Pythons.

    python3 tests/cifar_python_folder_test.py
"""
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = 20  # per batch


def numpy_pythons():
    """{numpy major: a Python with that numpy}, the running one first."""
    found = {}
    candidates = [sys.executable, os.path.join(os.environ.get("LTRAIN_VENV") or os.path.join(REPO_ROOT, ".venv"),
                                               "bin", "python3"),
                  os.path.join(REPO_ROOT, ".venv-plots", "bin", "python3"), "/usr/bin/python3"]
    for python in candidates:
        if not os.access(python, os.X_OK):
            continue
        done = subprocess.run([python, "-c", "import numpy; print(numpy.__version__)"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, check=False)
        if done.returncode == 0:
            found.setdefault(int(done.stdout.split(".")[0]), python)
    return found


def pickled(obj, form):
    """OBJ's pickle as numpy 1 (`numpy1`) or numpy 2 (`numpy2`) writes it at protocol 2, or this
    numpy's at the newest protocol (`newest`). Protocol 2 names a class by a line of text (GLOBAL), so
    the module's name can be swapped in place (a pickle without numpy's classes stays as it is)."""
    if form == "newest":
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = pickle.dumps(obj, protocol=2)
    ours, other = (b"cnumpy._core.", b"cnumpy.core.") if form == "numpy1" else (b"cnumpy.core.", b"cnumpy._core.")
    return data.replace(ours, other)


def cifar10_batches(rng):
    return {name: (rng.integers(0, 256, (RECORDS, 3072), dtype=np.uint8), rng.integers(0, 10, RECORDS).tolist())
            for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}


def write_cifar10(folder, batches, form):
    os.makedirs(folder)
    for name, (data, labels) in batches.items():
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [b"made_up.png"] * len(labels)}
        with open(os.path.join(folder, name), "wb") as f:
            f.write(pickled(batch, form))
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        f.write(pickled({b"label_names": [b"airplane"], b"num_vis": 3072}, form))


def run(script, dest, source, python):
    return subprocess.run(["bash", os.path.join(REPO_ROOT, "scripts", script), "--dest", dest, "--from", source],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
                          env=dict(os.environ, LTRAIN_PYTHON=python, LTRAIN_SHARED_DATA="/nonexistent"))


def expect_binary(folder, name, columns, failures, what):
    path = os.path.join(folder, name)
    want = np.concatenate(columns, axis=1).tobytes()
    got = open(path, "rb").read() if os.path.exists(path) else None
    if got != want:
        failures.append(f"{what}: {name} is not the folder's records byte for byte "
                        f"({'missing' if got is None else f'{len(got)} bytes, expected {len(want)}'})")


def check_cifar10(work, pythons, failures):
    rng = np.random.default_rng(7)
    batches = cifar10_batches(rng)
    for form in ("numpy1", "numpy2", "newest"):
        source = os.path.join(work, f"cifar10-{form}", "cifar-10-batches-py")
        write_cifar10(source, batches, form)
        for major, python in sorted(pythons.items()):
            what = f"CIFAR-10 pickled as {form}, converted under numpy {major} ({python})"
            dest = os.path.join(work, f"data10-{form}-{major}")
            done = run("get-cifar10.sh", dest, os.path.dirname(source), python)
            notes = [line for line in done.stdout.splitlines() if "is not the official CIFAR-10" in line]
            if done.returncode != 0 or len(notes) != 1 or "data_batch_1.bin 20 records" not in notes[0]:
                failures.append(f"{what}: exit {done.returncode}, expected 0 and one line saying it is not the "
                                f"official CIFAR-10:\n{done.stdout}")
                continue
            installed = os.path.join(dest, "cifar-10-batches-bin")
            for name, (data, labels) in batches.items():
                expect_binary(installed, name + ".bin", [np.array(labels, dtype=np.uint8)[:, None], data], failures, what)
            if not os.path.exists(os.path.join(installed, "SOURCE")):
                failures.append(f"{what}: no SOURCE file says where the files came from")
            again = run("get-cifar10.sh", dest, os.path.dirname(source), python)
            if again.returncode != 0 or "already present: converted from torchvision's Python release" not in again.stdout:
                failures.append(f"{what}: a second run: exit {again.returncode}, expected it kept:\n{again.stdout}")

    # Malformed: an image of 3071 bytes; a label outside 0-9. Refused, nothing installed.
    python = next(iter(pythons.values()))
    for case, (data, labels), expected in [
            ("short-rows", (batches["test_batch"][0][:, :3071], batches["test_batch"][1]), "data of shape [20, 3071]"),
            ("label-10", (batches["test_batch"][0], [10] + batches["test_batch"][1][1:]), "outside 0-9")]:
        source = os.path.join(work, f"cifar10-{case}")
        write_cifar10(source, dict(batches, test_batch=(data, labels)), "newest")
        dest = os.path.join(work, f"data10-{case}")
        done = run("get-cifar10.sh", dest, source, python)
        lines = done.stdout.splitlines()
        if done.returncode != 3 or expected not in done.stdout or "is not a well-formed Python release" not in lines[-1]:
            failures.append(f"a batch with {case}: exit {done.returncode}, expected 3 and a line with "
                            f"'{expected}':\n{done.stdout}")
        if os.path.exists(os.path.join(dest, "cifar-10-batches-bin")):
            failures.append(f"a batch with {case} was installed")


def check_cifar100(work, pythons, failures):
    rng = np.random.default_rng(11)
    parts = {name: (rng.integers(0, 256, (RECORDS, 3072), dtype=np.uint8), rng.integers(0, 20, RECORDS).tolist(),
                    rng.integers(0, 100, RECORDS).tolist()) for name in ("train", "test")}
    for form in ("numpy1", "numpy2"):
        source = os.path.join(work, f"cifar100-{form}", "cifar-100-python")
        os.makedirs(source)
        for name, (data, coarse, fine) in parts.items():
            with open(os.path.join(source, name), "wb") as f:
                f.write(pickled({b"data": data, b"coarse_labels": coarse, b"fine_labels": fine}, form))
        with open(os.path.join(source, "meta"), "wb") as f:
            f.write(pickled({b"coarse_label_names": [b"fish", b"trees"], b"fine_label_names": [b"apple"],
                             b"shape": np.zeros(1)}, form))
        for major, python in sorted(pythons.items()):
            what = f"CIFAR-100 pickled as {form}, converted under numpy {major}"
            dest = os.path.join(work, f"data100-{form}-{major}")
            done = run("get-cifar100.sh", dest, source, python)
            notes = [line for line in done.stdout.splitlines() if "is not the official CIFAR-100" in line]
            if done.returncode != 0 or len(notes) != 1:
                failures.append(f"{what}: exit {done.returncode}, expected 0 and one line saying it is not the "
                                f"official CIFAR-100:\n{done.stdout}")
                continue
            installed = os.path.join(dest, "cifar-100-binary")
            for name, (data, coarse, fine) in parts.items():
                expect_binary(installed, name + ".bin", [np.array(coarse, dtype=np.uint8)[:, None],
                                                         np.array(fine, dtype=np.uint8)[:, None], data], failures, what)
            names = open(os.path.join(installed, "coarse_label_names.txt")).read()
            if names != "fish\ntrees\n":
                failures.append(f"{what}: coarse_label_names.txt is {names!r}")


def main():
    pythons = numpy_pythons()
    print("cifar_python_folder_test: converting under " +
          ", ".join(f"numpy {major} ({python})" for major, python in sorted(pythons.items())))
    failures = []
    if os.environ.get("LTRAIN_REQUIRE_PYTHON_CHECKS") == "1" and not {1, 2} <= set(pythons):
        failures.append(f"numpy 1 and numpy 2 are both needed (LTRAIN_REQUIRE_PYTHON_CHECKS=1); found "
                        f"{sorted(pythons)}: .venv/ (bash scripts/python-env.sh) has numpy 2, Debian's python3-numpy 1")
    with tempfile.TemporaryDirectory() as work:
        check_cifar10(work, pythons, failures)
        check_cifar100(work, pythons, failures)
    for failure in failures:
        print(f"cifar_python_folder_test: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
