#!/usr/bin/env python3
"""scripts/lib/cuda-toolkit.sh and setup.sh's choice of nvcc, on made-up folders: NVIDIA's toolchain
wheels beside a torch (site-packages/nvidia/cu13 with bin/nvcc, include/, lib/libcudart.so.13,
nvvm/) made a toolkit folder of links, with the unversioned library names and the first folder's file
where two have one; the system's toolkit folders (CUDA_HOME here) hidden from CMake's search and
off the PATH; and `setup.sh --check` taking the wheels' nvcc where the PATH's is of another CUDA
major version or LTRAIN_NVCC=pip says so, naming it, with the stand-in python3 answering as torch
2.11.0+cu130 would.

    python3 tests/cuda_toolkit_test.py
"""
import os
import stat
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(REPO_ROOT, "scripts", "lib", "cuda-toolkit.sh")


def write(path, text, executable=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, stat.S_IRWXU)


def nvcc(path, release):
    write(path, f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.88'\n", executable=True)


def bash(script, env=None):
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source '{LIBRARY}'; {script}"], cwd=REPO_ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
                          env=dict(os.environ, **(env or {})))


def main():
    failures = []
    with tempfile.TemporaryDirectory() as work:
        site = os.path.join(work, "site-packages")
        wheels = os.path.join(site, "nvidia", "cu13")
        nvcc(os.path.join(wheels, "bin", "nvcc"), "13.0")
        write(os.path.join(wheels, "bin", "nvcc.profile"), "TOP = $(_HERE_)/..\n")
        write(os.path.join(wheels, "include", "cuda_runtime.h"), "// the wheels'\n")
        write(os.path.join(wheels, "lib", "libcudart.so.13"), "")
        write(os.path.join(wheels, "nvvm", "bin", "cicc"), "")
        other = os.path.join(work, "carried", "nvidia", "cu13")
        write(os.path.join(other, "include", "cuda_runtime.h"), "// another folder's\n")
        write(os.path.join(other, "include", "crt", "host_config.h"), "")

        view = os.path.join(work, "build", "cuda-toolkit")
        done = bash(f"cuda_toolkit_view '{view}' '{wheels}' '{other}'")
        if done.returncode != 0:
            failures.append(f"cuda_toolkit_view: exit {done.returncode}: {done.stdout}")
        else:
            expect = {"bin/nvcc": os.path.join(wheels, "bin", "nvcc"),
                      "include/cuda_runtime.h": os.path.join(wheels, "include", "cuda_runtime.h"),
                      "include/crt": os.path.join(other, "include", "crt"),
                      "lib64/libcudart.so.13": os.path.join(wheels, "lib", "libcudart.so.13"),
                      "lib64/libcudart.so": os.path.join(wheels, "lib", "libcudart.so.13"),
                      "lib/libcudart.so": os.path.join(wheels, "lib", "libcudart.so.13"),
                      "nvvm/bin/cicc": os.path.join(wheels, "nvvm", "bin", "cicc")}
            for name, target in expect.items():
                path = os.path.join(view, name)
                if not os.path.exists(path) or os.path.realpath(path) != os.path.realpath(target):
                    failures.append(f"the toolkit folder's {name} does not lead to {target}")
            made = os.stat(os.path.join(view, ".ltrain-view")).st_mtime_ns
            bash(f"cuda_toolkit_view '{view}' '{wheels}' '{other}'")
            if os.stat(os.path.join(view, ".ltrain-view")).st_mtime_ns != made:
                failures.append("a second cuda_toolkit_view of the same folders made the toolkit folder again")

        # A system toolkit in CUDA_HOME: hidden from CMake's search and off the PATH.
        system = os.path.join(work, "cuda-12.4")
        nvcc(os.path.join(system, "bin", "nvcc"), "12.4")
        env = {"CUDA_HOME": system, "PATH": os.path.join(system, "bin") + ":/usr/bin:/bin"}
        done = bash("cuda_ignore_args; echo \"PATH=$(path_without_system_cuda)\"", env)
        if (f"-DCMAKE_IGNORE_PREFIX_PATH={system}" not in done.stdout
                or f"{system}/include;" not in done.stdout or f"{system}/lib64;" not in done.stdout):
            failures.append(f"cuda_ignore_args does not hide {system}: {done.stdout}")
        if "PATH=/usr/bin:/bin\n" not in done.stdout:
            failures.append(f"path_without_system_cuda kept {system}/bin: {done.stdout}")

        # setup.sh --check with a stand-in torch whose site-packages holds the wheels.
        tools = os.path.join(work, "tools")
        prefix = os.path.join(site, "torch", "share", "cmake")
        write(os.path.join(tools, "python3"), f"#!/bin/sh\necho '2.11.0 13.0 1 {prefix}'\n", executable=True)
        nvcc(os.path.join(tools, "nvcc"), "12.4")

        def check(extra):
            command = (f"env -u LIBTORCH -u CMAKE_PREFIX_PATH -u CUDA_HOME -u CUDA_PATH -u LTRAIN_NVCC "
                       f"LTRAIN_VENV={work}/no-venv PATH={tools}:/usr/bin:/bin {extra} bash scripts/setup.sh --check")
            return subprocess.run(command, shell=True, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, check=False)

        wheel_nvcc = os.path.join(wheels, "bin", "nvcc")
        done = check("")
        if (done.returncode != 0 or f"nvcc 12.4 ({tools}/nvcc) is CUDA 12" not in done.stdout
                or f"nvcc 13.0 ({wheel_nvcc}): NVIDIA's toolchain wheels beside torch" not in done.stdout):
            failures.append(f"an nvcc 12.4 on the PATH: exit {done.returncode}, expected it passed over for the "
                            f"wheels':\n{done.stdout}")
        nvcc(os.path.join(tools, "nvcc"), "13.0")
        done = check("")
        if done.returncode != 0 or f"nvcc 13.0 ({tools}/nvcc): the system's CUDA toolkit" not in done.stdout:
            failures.append(f"an nvcc 13.0 on the PATH: exit {done.returncode}, expected it taken:\n{done.stdout}")
        done = check("LTRAIN_NVCC=pip")
        if done.returncode != 0 or f"nvcc 13.0 ({wheel_nvcc}): NVIDIA's toolchain wheels" not in done.stdout:
            failures.append(f"LTRAIN_NVCC=pip: exit {done.returncode}, expected the wheels' nvcc:\n{done.stdout}")
        os.remove(wheel_nvcc)
        nvcc(os.path.join(tools, "nvcc"), "12.4")
        done = check("")
        if done.returncode != 3 or "pip install 'cuda-toolkit[nvcc,cccl]==13.0.*'" not in done.stdout:
            failures.append(f"neither a matching nvcc nor the wheels: exit {done.returncode}, expected 3 naming the "
                            f"wheels to install:\n{done.stdout}")
    for failure in failures:
        print(f"cuda_toolkit_test: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
