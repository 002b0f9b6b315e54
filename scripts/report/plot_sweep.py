#!/usr/bin/env python3
"""Draws a sweep's results (`ltrain sweep` writes DIR/results.json) as DIR/results.png.

    python3 scripts/report/plot_sweep.py DIR

The x axis is data.batch_size when it was swept, else the first swept key; one line per
combination of the other keys. Mode bench: images/s and peak memory (reserved, GiB); mode
train: test accuracy and training time. Failed points (out of memory, ...) are listed under the
plot instead of drawn. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys

from plot_common import add_footer, load_results, plt, save_figure

PANELS = {"bench": [("img_per_s", "images / s"), ("reserved_gib", "peak reserved memory (GiB)")],
          "train": [("test_acc", "test accuracy"), ("train_s", "training time (s)")]}


def label(value):
    return value if isinstance(value, str) else json.dumps(value)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="the folder ltrain sweep wrote")
    args = p.parse_args(argv)
    doc = load_results(args.dir, "plot_sweep")
    if doc is None:
        return 3
    keys, rows = doc["keys"], doc["rows"]
    x_key = "data.batch_size" if "data.batch_size" in keys else keys[0]
    others = [k for k in keys if k != x_key]
    numeric_x = all(isinstance(r.get(x_key), (int, float)) for r in rows)
    panels = PANELS[doc["mode"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    failed = [r for r in rows if r.get("error")]
    for axis, (column, title) in zip(axes, panels):
        series = {}
        for r in rows:
            if r.get("error") or column not in r:
                continue
            name = ", ".join(f"{k}={label(r[k])}" for k in others) or "all"
            series.setdefault(name, []).append((r[x_key], r[column]))
        for name, points in series.items():
            points.sort(key=lambda xy: xy[0] if numeric_x else str(xy[0]))
            xs = [xy[0] if numeric_x else label(xy[0]) for xy in points]
            axis.plot(xs, [xy[1] for xy in points], marker="o", label=name)
        if not series:
            axis.text(0.5, 0.5, "not measured on this device", ha="center", va="center", transform=axis.transAxes)
        axis.set_xlabel(x_key)
        axis.set_ylabel(title)
        if numeric_x and x_key == "data.batch_size":
            axis.set_xscale("log", base=2)
        axis.grid(True, alpha=0.3)
        if len(series) > 1:
            axis.legend(fontsize=8)
    bottom = 0
    if failed:
        bottom = add_footer(fig, "failed: " + "; ".join(f"{', '.join(f'{k}={label(r[k])}' for k in keys)}: {r['error']}"
                                                        for r in failed))
    fig.suptitle(f"ltrain sweep ({doc['mode']}): {os.path.basename(os.path.normpath(args.dir))}")
    fig.tight_layout(rect=(0, bottom, 1, 0.95))
    return save_figure(fig, os.path.join(args.dir, "results.png"))


if __name__ == "__main__":
    sys.exit(main())
