#!/usr/bin/env python3
"""Draws a run's curves from its run directory (metrics.jsonl) as RUN/curves.png.

    python3 scripts/report/plot_run.py RUN_DIR [RUN_DIR ...] [--out FILE]

Four panels against the optimizer step: training loss (per log interval and per epoch) with the
test loss, training and test accuracy, the learning rate, and images/s. Several run directories
are drawn over one another (one colour each) into --out (default: the first run's curves.png).
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys

from plot_common import plt, save_figure


def read_rows(run_dir):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def series(rows, kind, key):
    points = [(r["step"], r[key]) for r in rows if r["kind"] == kind and r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", help="PNG file to write (default: FIRST_RUN/curves.png)")
    args = p.parse_args(argv)
    try:
        runs = [(os.path.basename(os.path.normpath(d)), read_rows(d)) for d in args.runs]
    except (OSError, ValueError, KeyError) as exc:
        print(f"plot_run: {exc}", file=sys.stderr)
        return 3
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (loss_ax, acc_ax), (lr_ax, speed_ax) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (name, rows) in enumerate(runs):
        c = colours[index % len(colours)]
        xs, ys = series(rows, "step", "train_loss")
        loss_ax.plot(xs, ys, color=c, alpha=0.35, linewidth=1)
        xs, ys = series(rows, "epoch", "train_loss")
        loss_ax.plot(xs, ys, color=c, marker="o", label=f"{name} train")
        xs, ys = series(rows, "epoch", "test_loss")
        loss_ax.plot(xs, ys, color=c, marker="s", linestyle="--", label=f"{name} test")
        xs, ys = series(rows, "epoch", "train_acc")
        acc_ax.plot(xs, [100 * y for y in ys], color=c, marker="o", label=f"{name} train")
        xs, ys = series(rows, "epoch", "test_acc")
        acc_ax.plot(xs, [100 * y for y in ys], color=c, marker="s", linestyle="--", label=f"{name} test")
        xs, ys = series(rows, "step", "lr")
        lr_ax.plot(xs, ys, color=c, label=name)
        xs, ys = series(rows, "step", "img_per_s")
        speed_ax.plot(xs, ys, color=c, label=name)
    for axis, title in ((loss_ax, "loss"), (acc_ax, "accuracy (%)"), (lr_ax, "learning rate"),
                        (speed_ax, "images / s (per log interval)")):
        axis.set_xlabel("step")
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle("ltrain: " + ", ".join(name for name, _ in runs))
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return save_figure(fig, args.out or os.path.join(args.runs[0], "curves.png"))


if __name__ == "__main__":
    sys.exit(main())
