"""What the plot scripts share: matplotlib without a display, and reading an ltrain results.json."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (re-exported)


def load_results(folder, tool):
    """FOLDER/results.json as a dict, or None after printing why (`tool: path: error`) to stderr."""
    path = os.path.join(folder, "results.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        print(f"{tool}: {path}: {exc}", file=sys.stderr)
        return None
