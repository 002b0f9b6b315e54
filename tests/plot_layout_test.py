#!/usr/bin/env python3
"""The plots' text laid out whole: claims.png (scripts/report/plot_report.py) of a report where most
claims could not be measured (a CPU's), and results.png (plot_sweep.py) of a sweep with many failed
points. Each list under the plot must hold every name in full, and every text of the figure must lie
inside it and off the axes. Needs matplotlib (bash scripts/python-env.sh --plots).

    python3 tests/plot_layout_test.py
"""
import json
import os
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts", "report"))

import plot_report  # noqa: E402
import plot_sweep  # noqa: E402
from plot_common import plt  # noqa: E402

CLAIMS = [
    "AMP (fp16 autocast with a GradScaler) trains 2-3x faster than FP32",
    "AMP uses 30% less memory than FP32",
    "TF32 speeds up FP32 matmuls and convolutions on Ampere and later GPUs",
    "CUDA graphs make training 15% faster",
    "FP16 and TF32 together raise throughput 3x",
    "cudnn.benchmark picks faster convolution algorithms for fixed input shapes",
    "Gradient accumulation reaches the same effective batch (256) with less memory",
    "Activation checkpointing (checkpoint_sequential, 4 segments) trades compute for memory",
    "matmul TFLOPS test (n = 8192, 100 timed), fp32 / tf32 / fp16 / bf16 on the card the guide names",
    "The card has 24 GB of memory and the Ada architecture, which the last claim of this list names in full",
]


def report_doc():
    claims = [{"claim": CLAIMS[0], "guide": "the 4090 guide", "claimed_ratio": 2.0, "ratio": 1.02, "ratio_low": 0.97,
               "ratio_high": 1.05, "verdict": "does not hold", "image_size": 32}]
    claims += [{"claim": text, "guide": "the GPU guides", "verdict": "not measurable: fp16 needs a CUDA device"}
               for text in CLAIMS[1:]]
    return {"device": "cpu (2 cores)", "claims": claims}


def layout_problems(fig, footer_words, what):
    """What of FIG's text lies outside it or over an axes, and which of FOOTER_WORDS its texts lack."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    problems = []
    axes_boxes = [axis.get_tightbbox(renderer) for axis in fig.axes]
    texts = [t for t in fig.texts if t.get_text()]
    for text in texts:
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 0.5 or box.y0 < frame.y0 - 0.5 or box.x1 > frame.x1 + 0.5 or box.y1 > frame.y1 + 0.5:
            problems.append(f"{what}: a text runs out of the figure ({box} outside {frame}): {text.get_text()[:60]!r}")
        for axis_box in axes_boxes:
            if box.overlaps(axis_box):
                problems.append(f"{what}: the text under the plot overlaps an axes: {text.get_text()[:60]!r}")
    joined = " ".join(" ".join(t.get_text().split()) for t in texts)
    for words in footer_words:
        if words not in joined:
            problems.append(f"{what}: the list under the plot lacks {words!r}")
    for axis in fig.axes:
        box = axis.get_tightbbox(renderer)
        if box.x0 < frame.x0 - 0.5 or box.x1 > frame.x1 + 0.5 or box.y0 < frame.y0 - 0.5 or box.y1 > frame.y1 + 0.5:
            problems.append(f"{what}: an axes with its labels runs out of the figure")
    return problems


def main():
    problems = []
    fig = plot_report.claims_figure(report_doc())
    problems += layout_problems(fig, CLAIMS[1:], "claims.png")
    plt.close(fig)

    with tempfile.TemporaryDirectory() as work:
        rows = [{"data.batch_size": 2 ** k, "precision.mode": "fp16", "img_per_s": 1000.0 * k, "reserved_gib": 0.5 * k}
                for k in range(6, 9)]
        errors = [f"out of memory at batch {2 ** k}: CUDA out of memory. Tried to allocate {k} GiB (GPU 0; "
                  f"24 GiB total capacity; a long message that names every pool of the allocator {k})"
                  for k in range(9, 21)]
        rows += [{"data.batch_size": 2 ** (9 + i), "precision.mode": "fp16", "error": error}
                 for i, error in enumerate(errors)]
        with open(os.path.join(work, "results.json"), "w") as f:
            json.dump({"mode": "bench", "keys": ["data.batch_size", "precision.mode"], "rows": rows}, f)
        captured = {}
        original = plot_sweep.save_figure
        plot_sweep.save_figure = lambda fig, out: captured.setdefault("fig", fig) and 0
        try:
            code = plot_sweep.main([work])
        finally:
            plot_sweep.save_figure = original
        if code != 0 or "fig" not in captured:
            problems.append(f"plot_sweep.py exited {code} without a figure")
        else:
            problems += layout_problems(captured["fig"], [" ".join(e.split()) for e in errors], "results.png")
    for problem in problems:
        print(f"plot_layout_test: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
