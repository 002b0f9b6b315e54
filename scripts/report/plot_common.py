"""What the plot scripts share: matplotlib without a display, and reading an ltrain results.json."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (re-exported)


def save_figure(fig, out):
    """Writes the PNG OUT at the resolution every ltrain plot uses and says so; returns 0."""
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


def load_results(folder, tool):
    """FOLDER/results.json as a dict, or None after printing why (`tool: path: error`) to stderr."""
    path = os.path.join(folder, "results.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        print(f"{tool}: {path}: {exc}", file=sys.stderr)
        return None
