#!/usr/bin/env python3
"""scripts/pytorch/ddp_baseline.py (PyTorch's DDP, the baseline beside ltrain's data-parallel runs)
under torchrun on two CPU processes with Gloo: it trains, and rank 0's line says what ran and holds
a rate that follows from its own numbers.

    python3 tests/ddp_baseline_test.py
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The run takes about 15 s on an idle 2-core machine. A rank that hangs (a collective one rank never
# joins) fails the test with the output so far well before CTest's own limit would end it without a
# word, and so does a run whose processes outlive their written result.
TIME_LIMIT_S = 240
EXIT_AFTER_RESULT_S = 30


def run_baseline(out, log):
    """torchrun and its two workers in a process group of their own, all killed after TIME_LIMIT_S,
    or EXIT_AFTER_RESULT_S after the result file appeared; their output goes to `log` (a pipe would
    wait for workers that outlive torchrun). Returns (exit code or None, why it was stopped)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "ddp_baseline.py",
         "--device", "cpu", "--precision", "fp32", "--arch", "resnet18", "--batch", "4", "--steps", "2",
         "--warmup", "1", "--json", out],
        cwd=os.path.join(REPO_ROOT, "scripts", "pytorch"), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    started = time.monotonic()
    result_seen = None
    while True:
        try:
            return launcher.wait(timeout=0.5), ""
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if result_seen is None and os.path.exists(out):
            result_seen = now
        if result_seen is not None and now - result_seen > EXIT_AFTER_RESULT_S:
            why = f"its result was written, but torchrun and its workers had not exited {EXIT_AFTER_RESULT_S} s later"
            break
        if now - started > TIME_LIMIT_S:
            why = f"no exit within {TIME_LIMIT_S} s"
            break
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    return None, why


def main():
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "ddp.json")
        with open(os.path.join(work, "torchrun.log"), "w+") as log:
            code, why = run_baseline(out, log)
            log.seek(0)
            output = log.read()
        if code != 0 or not os.path.exists(out):
            ending = why if code is None else f"exit {code}"
            print(f"ddp_baseline_test: {ending}:\n{output}", file=sys.stderr)
            return 1
        line = json.load(open(out))
    expected = dict(tool="pytorch-ddp", processes=2, batch_per_process=4, global_batch=8, steps=2, mode="eager")
    problems = [f"{key} = {line.get(key)!r}, expected {value!r}" for key, value in expected.items()
                if line.get(key) != value]
    rate = 8 * 2 / line["seconds"]
    if not line["seconds"] > 0 or abs(line["images_per_second"] - rate) > 1e-9 * rate:
        problems.append(f"images_per_second {line['images_per_second']} from {line['seconds']} s, expected {rate}")
    if abs(line["ms_per_step"] - 1000 * line["seconds"] / 2) > 1e-9 * line["ms_per_step"]:
        problems.append(f"ms_per_step {line['ms_per_step']} from {line['seconds']} s")
    for problem in problems:
        print(f"ddp_baseline_test: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
