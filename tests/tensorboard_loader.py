#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event files with TensorBoard's own loaders and prints, as JSON,
what they hold: {"records": {file name: events}, "scalars": {tag: [[step, value], ...]},
"texts": {tag: [[step, text], ...]}, "plugins": {text tag: plugin name}}.

    python3 tests/tensorboard_loader.py RUN_DIR

tests/test_tensorboard.cpp compares its output with the run's metrics.jsonl. Needs the tensorboard
package (pip install tensorboard).
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader


def main(run_dir):
    records = {}
    for name in sorted(os.listdir(run_dir)):
        if "tfevents" in name:
            loader = event_file_loader.EventFileLoader(os.path.join(run_dir, name))
            records[name] = sum(1 for _ in loader.Load())
    # Size guidance 0: keep every event, not a sample.
    accumulator = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in tags["scalars"]}
    texts = {tag: [[e.step, e.tensor_proto.string_val[0].decode("utf-8")] for e in accumulator.Tensors(tag)]
             for tag in tags["tensors"]}
    plugins = {tag: accumulator.SummaryMetadata(tag).plugin_data.plugin_name for tag in tags["tensors"]}
    json.dump({"records": records, "scalars": scalars, "texts": texts, "plugins": plugins}, sys.stdout)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
