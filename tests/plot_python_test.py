#!/usr/bin/env python3
"""The plot scripts under a Python without matplotlib: they run again, with the same arguments,
under the project's environment ($LTRAIN_VENV), or, without one, say how to make the light one
(python-env.sh --plots) and exit 3.

    python3 tests/plot_python_test.py      # exit 0 when both hold
"""
import os
import stat
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "report", "plot_run.py")
# Runs SCRIPT as __main__ with matplotlib hidden from this interpreter.
WITHOUT_MATPLOTLIB = ("import os, runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
                      "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
                      "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_without_matplotlib(venv, *args):
    env = dict(os.environ, LTRAIN_VENV=venv)
    return subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, SCRIPT, *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)


def main():
    failures = []
    with tempfile.TemporaryDirectory() as work:
        # A project environment whose python3 writes down how it was called.
        venv = os.path.join(work, "venv")
        os.makedirs(os.path.join(venv, "bin"))
        calls = os.path.join(work, "calls")
        python = os.path.join(venv, "bin", "python3")
        with open(python, "w") as f:
            f.write(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{calls}'\nexit 7\n")
        os.chmod(python, stat.S_IRWXU)
        done = run_without_matplotlib(venv, "RUN_A", "RUN B")
        if done.returncode != 7:
            failures.append(f"with an environment: exit {done.returncode}, expected its python's 7: {done.stderr}")
        elif open(calls).read().splitlines() != [SCRIPT, "RUN_A", "RUN B"]:
            failures.append(f"with an environment: it was called with {open(calls).read().splitlines()}")

        done = run_without_matplotlib(os.path.join(work, "none"), "RUN_A")
        expected = "run bash scripts/python-env.sh --plots"
        if done.returncode != 3 or expected not in done.stderr or done.stderr.count("\n") != 1:
            failures.append(f"without one: exit {done.returncode}, stderr {done.stderr!r}: expected 3 and one "
                            f"line saying to {expected}")
    for failure in failures:
        print(f"plot_python_test: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
