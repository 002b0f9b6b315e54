#!/usr/bin/env python3
"""Ctrl-C typed into the terminal of an `ltrain launch` run, as a user would.

Checks that every rank stops after the same step with a checkpoint and the launcher exits 130,
that `--set checkpoint.resume=auto` continues the run to its end, and that the result is bitwise
the uninterrupted run's (deterministic settings; on GPUs, one per process and NCCL).

    python3 scripts/gpu/launch_interrupt_check.py --ltrain build/ltrain --out OUT [--device cuda] [--processes 2]

Writes OUT/report.json and the logs; exit 0 when every check holds, 1 otherwise.
"""
import argparse
import json
import os
import pty
import re
import select
import subprocess
import sys
import time


def write_config(out, device):
    config = {
        "run": {"device": device, "epochs": 100000, "max_steps": 120, "log_every_steps": 1,
                "out_dir": os.path.join(out, "runs"), "name": "interrupted"},
        "model": {"arch": "resnet18", "stem": "cifar", "width": 16},
        "data": {"source": "synthetic", "synthetic_train_size": 4096, "synthetic_test_size": 256, "batch_size": 32},
        "optim": {"name": "sgd", "lr": 0.02, "momentum": 0.9},
        "schedule": {"name": "constant"},
        "checkpoint": {"every_steps": 10},
        "precision": {"deterministic": True},
        "distributed": {"timeout_s": 60},
    }
    path = os.path.join(out, "run.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def metrics_rows(run_dir):
    """The step rows in RUN_DIR/metrics.jsonl (not its "run" and "epoch" rows)."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if '"kind":"step"' in line)
    except OSError:
        return 0


def interrupted_run(command, run_dir, rows_before_ctrl_c, timeout):
    """Runs `command` in a pseudo-terminal; types Ctrl-C once `rows_before_ctrl_c` steps are logged."""
    pid, terminal = pty.fork()
    if pid == 0:
        os.execv(command[0], command)
    output, typed, start = b"", False, time.time()
    while True:
        if not typed and metrics_rows(run_dir) >= rows_before_ctrl_c:
            os.write(terminal, b"\x03")
            typed = True
        ready, _, _ = select.select([terminal], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # the terminal closed: every process of it is gone
                break
            if not chunk:
                break
            output += chunk
        if time.time() - start > timeout:
            os.kill(pid, 9)
            break
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code, output.decode(errors="replace"), typed


def export(ltrain, run_dir, out_file, log):
    checkpoints = sorted(f for f in os.listdir(os.path.join(run_dir, "checkpoints")) if f.startswith("step-"))
    subprocess.run([ltrain, "export", "--checkpoint", os.path.join(run_dir, "checkpoints", checkpoints[-1]),
                    "--out", out_file], stdout=log, stderr=subprocess.STDOUT, check=True)
    return checkpoints[-1]


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, without its metadata."""
    with open(path, "rb") as f:
        header_size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_size))
        data = f.read()
    return {name: (entry["dtype"], entry["shape"], data[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items() if name != "__metadata__"}


def differing_tensors(a, b):
    """The names of the tensors whose dtype, shape or bytes differ between two safetensors files."""
    x, y = read_safetensors(a), read_safetensors(b)
    return sorted(name for name in x.keys() | y.keys() if x.get(name) != y.get(name))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ltrain", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--ctrl-c-after", type=int, default=25, help="logged steps before Ctrl-C")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ltrain = os.path.abspath(args.ltrain)
    config = write_config(args.out, args.device)
    command = [ltrain, "launch", "-n", str(args.processes), "--", "train", "--config", config]
    run_dir = os.path.join(args.out, "runs", "interrupted")
    report = {"command": " ".join(command), "device": args.device}

    code, output, typed = interrupted_run(command, run_dir, args.ctrl_c_after, timeout=300)
    with open(os.path.join(args.out, "interrupted.log"), "w") as f:
        f.write(output)
    steps = [int(s) for s in re.findall(r"stopped by signal 2 after step (\d+); checkpoint", output)]
    report.update({"ctrl_c_typed": typed, "exit_code": code, "ranks_stopped_after_step": steps,
                   "second_signal": "second signal" in output})
    with open(os.path.join(args.out, "resume.log"), "w") as log:
        report["resume_exit_code"] = subprocess.run(command + ["--set", "checkpoint.resume=auto"], stdout=log,
                                                    stderr=subprocess.STDOUT).returncode
    with open(os.path.join(args.out, "whole.log"), "w") as log:
        report["whole_exit_code"] = subprocess.run(command + ["--set", "run.name=whole"], stdout=log,
                                                   stderr=subprocess.STDOUT).returncode
    with open(os.path.join(args.out, "export.log"), "w") as log:
        report["resumed_final_checkpoint"] = export(ltrain, run_dir, os.path.join(args.out, "resumed.safetensors"), log)
        report["whole_final_checkpoint"] = export(ltrain, os.path.join(args.out, "runs", "whole"),
                                                  os.path.join(args.out, "whole.safetensors"), log)
    report["differing_tensors"] = differing_tensors(os.path.join(args.out, "resumed.safetensors"),
                                                    os.path.join(args.out, "whole.safetensors"))
    checks = {
        "exit 130 after Ctrl-C": typed and code == 130,
        "every rank stopped after the same step": len(steps) == args.processes and len(set(steps)) == 1,
        "no second signal": not report["second_signal"],
        "resume and uninterrupted runs succeed": report["resume_exit_code"] == 0 and report["whole_exit_code"] == 0,
        "the same final checkpoint": report["resumed_final_checkpoint"] == report["whole_final_checkpoint"],
        "bitwise the same weights": not report["differing_tensors"],
    }
    report["checks"] = checks
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
