#!/usr/bin/env python3
"""Table of two ltrain builds measured side by side (scripts/gpu/compare-builds.sh).

Reads the builds.jsonl lines (bench step --json with "build" and "round" added) and prints, per
batch size, each build's median img/s over the rounds and the candidate/baseline ratio: the median
of the per-round ratios and their range.
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="builds.jsonl written by scripts/gpu/compare-builds.sh")
    args = parser.parse_args()

    speed = defaultdict(dict)  # (precision, batch) -> {(build, round): img/s}
    with open(args.results) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                speed[(r["precision"], r["batch_size"])][(r["build"], r["round"])] = r["images_per_second"]
    if not speed:
        sys.exit("compare_builds_report: no results in " + args.results)

    print("| precision | batch | baseline img/s | candidate img/s | ratio (median) | ratio range | rounds |")
    print("|---|---|---|---|---|---|---|")
    for (precision, batch), runs in sorted(speed.items()):
        rounds = sorted({r for (_, r) in runs if ("baseline", r) in runs and ("candidate", r) in runs})
        ratios = [runs[("candidate", r)] / runs[("baseline", r)] for r in rounds]
        base = statistics.median(runs[("baseline", r)] for r in rounds)
        cand = statistics.median(runs[("candidate", r)] for r in rounds)
        print(f"| {precision} | {batch} | {base:,.0f} | {cand:,.0f} | {statistics.median(ratios):.3f} "
              f"| {min(ratios):.3f}-{max(ratios):.3f} | {len(rounds)} |")


if __name__ == "__main__":
    main()
