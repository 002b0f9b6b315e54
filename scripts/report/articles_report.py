#!/usr/bin/env python3
"""Table (and plot) of the guides' own recipes against ltrain's, from scripts/gpu/articles.sh's OUT.

    python3 scripts/report/articles_report.py OUT [--md FILE] [--plot FILE]
    python3 scripts/report/articles_report.py --self-test     # checks the arithmetic on built-in numbers

Reads OUT/RECIPE/{guide,ltrain}-seed-S.json. Per recipe, one row for the guide's code and one for
ltrain: the seeds that finished, epochs, time to finish (wall seconds from launch to exit, measured
from outside: mean and min-max), training seconds (mean), training img/s (mean), test accuracy
(mean and min-max, %), peak GPU memory (GiB, the largest over seeds). ltrain's row adds:
  - guide time / ltrain time: the mean over seeds of the per-seed ratio (guide seed S over ltrain
    seed S; only seeds that finished on both sides), and its min-max;
  - "ltrain >= 3x faster": yes when the ratio is 3 or more on every paired seed;
  - accuracy difference: ltrain's mean minus the guide's, in points;
  - "accuracy within the seeds' spread": yes when the two min-max ranges of test accuracy overlap
    (each side's runs reach into the other's range); n/a with fewer than 2 seeds on a side.
Runs with epochs other than the guide's are marked "N epochs, not the guide's M" (speed only).
Runs that shared the host (runs_at_once above 1: articles.sh --guides-together) give accuracy only:
no speed ratio and no 3x verdict.
Runs that failed are listed under the table. Standard library only; the plot needs matplotlib.
"""
import argparse
import glob
import json
import os
import statistics
import sys
import tempfile

SIDES = (("guide", "guide's code"), ("ltrain", "ltrain"))
GUIDE_EPOCHS = {"5090": 100, "4090": 100, "4090d": 10}
SPEEDUP_CLAIM = 3.0
GIB = float(1 << 30)


def load(out):
    """{recipe: {side: {seed: record}}} from OUT/RECIPE/SIDE-seed-S.json."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*", "*-seed-*.json"))):
        side = os.path.basename(path).split("-seed-")[0]
        if side not in dict(SIDES):
            continue
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"articles_report: {path}: {exc}", file=sys.stderr)
            continue
        recipe = os.path.basename(os.path.dirname(path))
        seed = int(record.get("seed", os.path.basename(path)[:-5].split("-seed-")[1]))
        runs.setdefault(recipe, {}).setdefault(side, {})[seed] = record
    return runs


def finished(record):
    return record.get("exit_code", 0) == 0 and record.get("test_accuracy") is not None


def spread(values):
    """(mean, min, max) of a non-empty list."""
    return statistics.mean(values), min(values), max(values)


def side_stats(records):
    """Numbers of one side of one recipe over its finished seeds; None if none finished."""
    done = {seed: r for seed, r in sorted(records.items()) if finished(r)}
    if not done:
        return None
    mems = [r["peak_memory_bytes"] for r in done.values() if r.get("peak_memory_bytes") is not None]
    return {
        "seeds": list(done),
        "epochs": sorted({r.get("epochs") for r in done.values()}, key=str),
        "wall": spread([r["outside_wall_seconds"] for r in done.values()]),
        "train": statistics.mean(r["train_seconds"] for r in done.values()),
        "ips": statistics.mean(r["images_per_second"] for r in done.values()),
        "accuracy": spread([100.0 * r["test_accuracy"] for r in done.values()]),
        "peak_gib": max(mems) / GIB if mems else None,
        "walls": {seed: r["outside_wall_seconds"] for seed, r in done.items()},
        "runs_at_once": max(r.get("runs_at_once", 1) for r in done.values()),
    }


def compare(guide, ltrain):
    """Ratio of times (paired by seed), the 3x verdict, accuracy difference and overlap verdict.
    No ratio where either side's runs shared the host (scripts/gpu/articles.sh --guides-together)."""
    shared = guide["runs_at_once"] > 1 or ltrain["runs_at_once"] > 1
    paired = [] if shared else sorted(set(guide["walls"]) & set(ltrain["walls"]))
    ratios = [guide["walls"][s] / ltrain["walls"][s] for s in paired]
    _, g_lo, g_hi = guide["accuracy"]
    _, l_lo, l_hi = ltrain["accuracy"]
    if len(guide["seeds"]) < 2 or len(ltrain["seeds"]) < 2:
        overlap = "n/a"
    else:
        overlap = "yes" if l_lo <= g_hi and g_lo <= l_hi else "no"
    return {
        "ratio": spread(ratios) if ratios else None,
        "faster": ("yes" if min(ratios) >= SPEEDUP_CLAIM else "no") if ratios else "n/a",
        "shared": shared,
        "accuracy_diff": ltrain["accuracy"][0] - guide["accuracy"][0],
        "overlap": overlap,
    }


def epochs_cell(recipe, epochs):
    text = "/".join(str(e) for e in epochs)
    guide = GUIDE_EPOCHS.get(recipe)
    if guide is not None and epochs != [guide]:
        return f"{text} (not the guide's {guide})"
    return text


def table(runs):
    """The markdown report as a list of lines."""
    lines = [
        "| recipe | side | seeds | epochs | time to finish, s: mean (min-max) | training s | img/s "
        "| test accuracy: mean (min-max) | peak GiB | guide time / ltrain time: mean (min-max) "
        "| ltrain >= 3x faster | accuracy difference | accuracy within the seeds' spread |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for recipe in sorted(runs):
        stats = {side: side_stats(runs[recipe].get(side, {})) for side, _ in SIDES}
        epochs = sorted({e for s in stats.values() if s for e in s["epochs"]}, key=str)
        if recipe in GUIDE_EPOCHS and epochs and epochs != [GUIDE_EPOCHS[recipe]]:
            notes.append(f"{recipe}: {'/'.join(map(str, epochs))} epochs, not the guide's {GUIDE_EPOCHS[recipe]}: "
                         f"a speed measurement; its accuracy is not the recipe's")
        for side, name in SIDES:
            s = stats[side]
            failed = sorted((seed, r.get("exit_code")) for seed, r in runs[recipe].get(side, {}).items()
                            if not finished(r))
            for seed, code in failed:
                how = "finished without a test accuracy" if code == 0 else f"did not finish (exit {code})"
                notes.append(f"{recipe}, {name}, seed {seed}: {how}; see OUT/{recipe}/{side}-seed-{seed}.log")
            variants = sorted({r["recipe_variant"] for r in runs[recipe].get(side, {}).values()
                               if "recipe_variant" in r})
            if variants:  # the 5090 guide's code runs "as meant" or "as written"
                name = f"{name}, {' + '.join(variants)}"
            if s is None:
                lines.append(f"| {recipe} | {name} | none finished | | | | | | | | | | |")
                continue
            if s["runs_at_once"] > 1:
                notes.append(f"{recipe}, {name}: its runs ran at once with others ({s['runs_at_once']} at a time): "
                             f"their times measure a shared host, so no speed ratio is given")
            cells = [recipe, name, ", ".join(map(str, s["seeds"])), epochs_cell(recipe, s["epochs"]),
                     "{:.1f} ({:.1f}-{:.1f})".format(*s["wall"]), f"{s['train']:.1f}", f"{s['ips']:,.0f}",
                     "{:.2f}% ({:.2f}-{:.2f})".format(*s["accuracy"]),
                     "—" if s["peak_gib"] is None else f"{s['peak_gib']:.2f}"]
            if side == "ltrain" and stats["guide"] is not None:
                c = compare(stats["guide"], s)
                cells += ["n/a" if c["ratio"] is None else "{:.2f} ({:.2f}-{:.2f})".format(*c["ratio"]),
                          c["faster"], f"{c['accuracy_diff']:+.2f} points", c["overlap"]]
            else:
                cells += ["", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return lines


def host_lines(out):
    try:
        with open(os.path.join(out, "host.txt")) as f:
            return [f"    {line.rstrip()}" for line in f if line.strip()]
    except OSError:
        return []


def report(out):
    host = host_lines(out)
    lines = ["# The guides' recipes: their own PyTorch code against ltrain", ""]
    if host:
        lines += ["Host:", ""] + host + [""]
    lines += ["Time to finish: wall seconds from launch to exit, measured from outside (Python's or ltrain's start, "
              "data loading, compilation and the test pass included). The ratio pairs runs of the same seed.", ""]
    return lines + table(load(out))


def plot(runs, path):
    """Grouped bars: time to finish per recipe, guide vs ltrain, min-max error bars, accuracy as text."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from plot_common import plt, save_figure
    except ImportError as exc:
        print(f"articles_report: no plot ({exc}); the table does not need it", file=sys.stderr)
        return 0
    recipes = sorted(runs)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 + 2.2 * len(recipes)), 4.2))
    width = 0.38
    longest, shortest = 0.0, float("inf")
    for i, (side, name) in enumerate(SIDES):
        label = name  # one legend entry per side
        for j, recipe in enumerate(recipes):
            s = side_stats(runs[recipe].get(side, {}))
            if s is None:
                continue
            mean, lo, hi = s["wall"]
            x = j + (i - 0.5) * width
            ax.bar(x, mean, width, yerr=[[mean - lo], [hi - mean]], capsize=4, color=f"C{i}", label=label)
            label = None
            ax.text(x, hi, f"{mean:.0f} s\n{s['accuracy'][0]:.1f}%", ha="center", va="bottom", fontsize=8)
            longest, shortest = max(longest, hi), min(shortest, lo)
    if 0 < shortest and longest / shortest > 20:  # 100-epoch and 10-epoch recipes side by side
        ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.set_xticks(range(len(recipes)))
    ax.set_xticklabels([f"{r} guide" for r in recipes])
    ax.set_ylabel("time to finish, s (mean, min-max)")
    ax.set_title("Guides' own code vs ltrain (text: test accuracy)")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def write_record(folder, recipe, side, seed, wall, accuracy, code=0, epochs=None, mem=None, **extra):
    os.makedirs(os.path.join(folder, recipe), exist_ok=True)
    record = {"seed": seed, "exit_code": code, "outside_wall_seconds": wall, "train_seconds": wall - 5,
              "images_per_second": 1000.0, "test_accuracy": accuracy, "peak_memory_bytes": mem,
              "epochs": epochs if epochs is not None else GUIDE_EPOCHS[recipe], **extra}
    with open(os.path.join(folder, recipe, f"{side}-seed-{seed}.json"), "w") as f:
        json.dump(record, f)


def self_test():
    """Checks the table's arithmetic on numbers worked out by hand; returns 0."""
    with tempfile.TemporaryDirectory() as folder:
        # 4090d: ratios 300/100 = 3.0, 330/110 = 3.0, 360/90 = 4.0 -> mean 3.333, min 3 -> yes.
        # Accuracy guide 60-64 (mean 62), ltrain 63-69 (mean 66): ranges overlap -> yes; +4.00 points.
        for seed, g, lt, ga, la in ((0, 300, 100, 0.60, 0.63), (1, 330, 110, 0.62, 0.66), (2, 360, 90, 0.64, 0.69)):
            write_record(folder, "4090d", "guide", seed, g, ga, mem=2 * GIB)
            write_record(folder, "4090d", "ltrain", seed, lt, la)
        # 5090: 2 epochs (not the guide's 100); ratios 2.9 and 3.5 -> no; accuracy 10-12 vs 20-21 -> no;
        # seed 2 of ltrain failed and is left out of every number.
        for seed, g, lt, ga, la in ((0, 290, 100, 0.10, 0.20), (1, 350, 100, 0.12, 0.21)):
            write_record(folder, "5090", "guide", seed, g, ga, epochs=2, recipe_variant="as meant")
            write_record(folder, "5090", "ltrain", seed, lt, la, epochs=2)
        write_record(folder, "5090", "guide", 2, 400, 0.11, epochs=2)
        write_record(folder, "5090", "ltrain", 2, 5, None, code=1, epochs=2)

        runs = load(folder)
        g, lt = side_stats(runs["4090d"]["guide"]), side_stats(runs["4090d"]["ltrain"])
        assert g["seeds"] == [0, 1, 2] and g["wall"] == (330, 300, 360), g
        assert abs(g["accuracy"][0] - 62.0) < 1e-9 and abs(g["peak_gib"] - 2.0) < 1e-12, g
        assert lt["peak_gib"] is None
        c = compare(g, lt)
        assert abs(c["ratio"][0] - 10 / 3) < 1e-9 and abs(c["ratio"][1] - 3.0) < 1e-9 and c["ratio"][2] == 4.0, c
        assert c["faster"] == "yes" and c["overlap"] == "yes" and abs(c["accuracy_diff"] - 4.0) < 1e-9, c

        g, lt = side_stats(runs["5090"]["guide"]), side_stats(runs["5090"]["ltrain"])
        assert g["seeds"] == [0, 1, 2] and lt["seeds"] == [0, 1], lt
        c = compare(g, lt)
        assert abs(c["ratio"][0] - 3.2) < 1e-9 and abs(c["ratio"][1] - 2.9) < 1e-9, c
        assert c["faster"] == "no" and c["overlap"] == "no", c

        # A range touching the other's end counts as overlapping; one seed a side gives n/a.
        edge = {"seeds": [0, 1], "walls": {0: 1.0}, "accuracy": (65.0, 64.0, 66.0), "runs_at_once": 1}
        assert compare({**edge, "accuracy": (63.0, 62.0, 64.0)}, edge)["overlap"] == "yes"
        assert compare({**edge, "seeds": [0]}, edge)["overlap"] == "n/a"

        text = "\n".join(report(folder))
        assert "| 4090d | ltrain | 0, 1, 2 | 10 | 100.0 (90.0-110.0) |" in text, text
        assert "| 3.33 (3.00-4.00) | yes | +4.00 points | yes |" in text, text
        assert "| 4090d | guide's code | 0, 1, 2 | 10 | 330.0 (300.0-360.0) | 325.0 | 1,000 " \
               "| 62.00% (60.00-64.00) | 2.00 |" in text, text
        assert "2 (not the guide's 100)" in text and "5090, ltrain, seed 2: did not finish (exit 1)" in text, text
        assert "- 5090: 2 epochs, not the guide's 100: a speed measurement" in text, text
        assert "| 5090 | guide's code, as meant | 0, 1, 2 | 2 (not the guide's 100) |" in text, text
        assert "4090d: 10 epochs" not in text, text
        assert "runs ran at once" not in text, text

        # The guide's runs started together: accuracy compared, times not.
        for seed, g, lt, ga, la in ((0, 900, 60, 0.60, 0.62), (1, 910, 61, 0.63, 0.64)):
            write_record(folder, "4090", "guide", seed, g, ga, runs_at_once=6)
            write_record(folder, "4090", "ltrain", seed, lt, la, runs_at_once=1)
        runs = load(folder)
        c = compare(side_stats(runs["4090"]["guide"]), side_stats(runs["4090"]["ltrain"]))
        assert c["ratio"] is None and c["faster"] == "n/a" and c["overlap"] == "yes", c
        assert abs(c["accuracy_diff"] - 1.5) < 1e-9, c
        text = "\n".join(report(folder))
        assert "- 4090, guide's code: its runs ran at once with others (6 at a time)" in text, text
        assert "| n/a | n/a | +1.50 points | yes |" in text, text
    print("articles_report self-test: ok")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", help="scripts/gpu/articles.sh's OUT folder")
    p.add_argument("--md", metavar="FILE", help="also write the markdown here")
    p.add_argument("--plot", metavar="FILE", help="grouped bars of time to finish (PNG; needs matplotlib)")
    p.add_argument("--self-test", action="store_true", help="check the arithmetic on built-in numbers")
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.out:
        p.error("OUT is required (or --self-test)")
    if not os.path.isdir(args.out):
        print(f"articles_report: {args.out} is not a folder: give scripts/gpu/articles.sh's OUT", file=sys.stderr)
        return 3
    runs = load(args.out)
    if not runs:
        print(f"articles_report: no OUT/RECIPE/*-seed-*.json under {args.out}", file=sys.stderr)
        return 3
    text = "\n".join(report(args.out)) + "\n"
    print(text, end="")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.plot:
        return plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
