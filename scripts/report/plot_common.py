"""What the plot scripts share: matplotlib without a display, and reading an ltrain results.json.

Where the Python that runs a plot script has no matplotlib, the script runs again under the
project's environment ($LTRAIN_VENV, default .venv/, which scripts/python-env.sh makes), or says
how to make it and exits 3.
"""
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_under_project_python():
    """Replaces this process with the same command under the project's Python, where that is
    another interpreter; otherwise prints what to do and exits 3."""
    venv = os.environ.get("LTRAIN_VENV") or os.path.join(REPO_ROOT, ".venv")
    python = os.path.join(venv, "bin", "python3")
    script = os.path.basename(sys.argv[0])
    if os.access(python, os.X_OK) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(python, [python] + sys.argv)
    print(f"{script}: {sys.executable} has no matplotlib: run bash scripts/python-env.sh (it makes {venv} "
          f"with it), then this command again", file=sys.stderr)
    sys.exit(3)


try:
    import matplotlib
except ImportError:
    run_under_project_python()

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
