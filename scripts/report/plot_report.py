#!/usr/bin/env python3
"""Draws an `ltrain reproduce` report's measured ratios beside the claimed ones as DIR/claims.png.

    python3 scripts/report/plot_report.py DIR

One bar per claim that is a ratio (images/s for speed claims, peak memory for memory claims, B
over A: the median of the rounds, their range as an error bar), with the ratio the claim needs
marked on it. Claims that could not be measured on the
device are listed under the plot, whole (the figure grows by their lines). Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import os
import sys
import textwrap

from plot_common import add_footer, load_results, plt, save_figure


def claims_figure(doc):
    """The figure of a reproduce report's results.json (a dict)."""
    claims = doc["claims"]
    measured = [c for c in claims if c.get("ratio") is not None]
    unmeasured = [c for c in claims if c["verdict"].startswith("not measurable")]
    fig, axis = plt.subplots(figsize=(11, 2.8 + 0.6 * max(1, len(measured))))

    def label(c):
        where = f", {c['image_size']}x{c['image_size']}" if c.get("image_size") else ""
        return "\n".join(textwrap.wrap(f"{c['claim']} ({c['guide']}{where})", 70))

    def colour(verdict):
        return {"holds": "tab:green", "does not hold": "tab:red", "measured": "tab:grey"}.get(verdict, "tab:orange")

    labels = [label(c) for c in measured]
    positions = list(range(len(measured)))
    ratios = [c["ratio"] for c in measured]
    # The rounds' range around the median, where there were several rounds.
    low = [c["ratio"] - (c.get("ratio_low") if c.get("ratio_low") is not None else c["ratio"]) for c in measured]
    high = [(c.get("ratio_high") if c.get("ratio_high") is not None else c["ratio"]) - c["ratio"] for c in measured]
    axis.barh(positions, ratios, xerr=[low, high], color=[colour(c["verdict"]) for c in measured], alpha=0.8,
              capsize=3)
    for y, c in zip(positions, measured):
        if c.get("claimed_ratio") is not None:
            axis.plot([c["claimed_ratio"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
        axis.text(c["ratio"], y, f" {c['ratio']:.2f}x ({c['verdict'].split(':')[0]})", va="center", fontsize=8)
    axis.set_yticks(positions)
    axis.set_yticklabels(labels, fontsize=8)
    axis.invert_yaxis()
    axis.axvline(1.0, color="grey", linewidth=0.8)
    axis.set_xlabel("measured ratio, B over A (black mark: what the claim needs)")
    if not measured:
        axis.text(0.5, 0.5, "no ratio could be measured on this device", ha="center", va="center",
                  transform=axis.transAxes)
    axis.set_title(f"The guides' claims on {doc['device']}", fontsize=10)
    bottom = 0
    if unmeasured:
        bottom = add_footer(fig, "not measurable here: " + "; ".join(c["claim"] for c in unmeasured))
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="the folder ltrain reproduce wrote")
    args = p.parse_args(argv)
    doc = load_results(args.dir, "plot_report")
    if doc is None:
        return 3
    return save_figure(claims_figure(doc), os.path.join(args.dir, "claims.png"))


if __name__ == "__main__":
    sys.exit(main())
