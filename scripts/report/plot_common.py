"""What the plot scripts share: matplotlib without a display, and reading an ltrain results.json.

Where the Python that runs a plot script has no matplotlib, the script runs again under the first
project environment there is: $LTRAIN_VENV, .venv-plots/ (numpy and matplotlib alone, which
`bash scripts/python-env.sh --plots` makes), .venv/ (the whole one, `bash scripts/python-env.sh`);
without one it says how to make the light one and exits 3.
"""
import json
import os
import sys
import textwrap

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def project_environments():
    """The environments a plot script runs again under, in order."""
    named = os.environ.get("LTRAIN_VENV")
    if named:
        return [named]
    return [os.path.join(REPO_ROOT, ".venv-plots"), os.path.join(REPO_ROOT, ".venv")]


def run_under_project_python():
    """Replaces this process with the same command under the first project environment that is
    another interpreter than this one; otherwise prints what to do and exits 3."""
    script = os.path.basename(sys.argv[0])
    for venv in project_environments():
        python = os.path.join(venv, "bin", "python3")
        if os.access(python, os.X_OK) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
            os.execv(python, [python] + sys.argv)
    print(f"{script}: {sys.executable} has no matplotlib: run bash scripts/python-env.sh --plots (it makes "
          f"{os.path.relpath(os.path.join(REPO_ROOT, '.venv-plots'))} with numpy and matplotlib alone, about 200 MB), "
          f"then this command again", file=sys.stderr)
    sys.exit(3)


try:
    import matplotlib
except ImportError:
    run_under_project_python()

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (re-exported)


def add_footer(fig, text, fontsize=7):
    """Writes TEXT whole under the plot, wrapped to the figure's width, and makes the figure taller
    by its lines; returns the share of the figure's height it takes, the bottom of the rect to give
    tight_layout."""
    width_in, height_in = fig.get_size_inches()
    # DejaVu Sans averages under 0.62 em a character; a margin of 7 pt each side.
    lines = textwrap.wrap(text, max(40, int((width_in * 72 - 14) / (fontsize * 0.62))))
    footer_in = (len(lines) * fontsize * 1.25 + 12) / 72
    fig.set_size_inches(width_in, height_in + footer_in)
    fig.text(7 / 72 / width_in, 6 / 72 / (height_in + footer_in), "\n".join(lines), fontsize=fontsize,
             va="bottom", ha="left")
    return footer_in / (height_in + footer_in)


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
