#!/usr/bin/env python3
"""Checks a run's TensorBoard event files against its metrics.jsonl with
TensorBoard's own reader (the `tensorboard` package).

    tb_read.py RUN_DIR FILES

RUN_DIR/tensorboard must hold FILES event files (one per segment of the
run), each starting with file_version "brain.Event:2". Every train and eval
record of RUN_DIR/metrics.jsonl must appear in TensorBoard with the same
step and the same values, to float32 rounding (TensorBoard's simple_value
is a float32; metrics.jsonl prints 6 or 9 significant digits), and
TensorBoard must hold nothing metrics.jsonl lacks. Exits 1 with a message
per mismatch.
"""
import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import event_file_loader

# TensorBoard tag -> metrics.jsonl key, per record type
TRAIN = {
    "train/loss": "loss",
    "train/accuracy": "acc",
    "train/lr": "lr",
    "train/grad_norm": "grad_norm",
    "train/samples_per_s": "samples_per_s",
    "train/loss_scale": "loss_scale",
    "time/step_s": "step_s",
    "time/data_wait_s": "data_wait_s",
    "time/compute_s": "compute_s",
    "time/comm_exposed_s": "comm_exposed_s",
    "time/optimizer_s": "optimizer_s",
    "time/accel_util": "accel_util",
}
GPU = {"gpu/util": "gpu_util", "gpu/mem_bytes": "gpu_mem_bytes", "gpu/power_w": "gpu_power_w"}
EVAL = {"eval/loss": "loss", "eval/accuracy": "acc"}


def close(a, b):
    """b (float32 from TensorBoard) equals a (printed with >= 6 digits)."""
    if a is None:
        return math.isnan(b) or math.isinf(b)
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b)) + 1e-12


def main():
    run, want_files = sys.argv[1], int(sys.argv[2])
    errors = []
    files = sorted(glob.glob(os.path.join(run, "tensorboard", "events.out.tfevents.*")))
    if len(files) != want_files:
        errors.append("%d event files in %s/tensorboard, expected %d" % (len(files), run, want_files))
    for f in files:
        first = next(iter(event_file_loader.EventFileLoader(f).Load()), None)
        if first is None or first.file_version != "brain.Event:2":
            errors.append("%s does not start with file_version brain.Event:2" % f)

    acc = ea.EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    tb = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}

    expected = {}  # tag -> {step: value}
    with open(os.path.join(run, "metrics.jsonl")) as fh:
        for line in fh:
            rec = json.loads(line)
            table = {"train": dict(TRAIN, **GPU), "eval": EVAL}.get(rec["type"])
            if not table:
                continue
            for tag, key in table.items():
                if key in rec:
                    expected.setdefault(tag, {})[rec["step"]] = rec[key]
    for tag in TRAIN.keys() | EVAL.keys():
        if tag not in expected:
            errors.append("metrics.jsonl has no values for %s" % tag)
    if tags != set(expected):
        errors.append("tags differ: TensorBoard only %s, metrics.jsonl only %s"
                      % (sorted(tags - set(expected)), sorted(set(expected) - tags)))
    checked = 0
    for tag, steps in expected.items():
        got = tb.get(tag, {})
        if set(got) != set(steps):
            errors.append("%s: steps %s in TensorBoard, %s in metrics.jsonl"
                          % (tag, sorted(got), sorted(steps)))
        for step, value in steps.items():
            if step in got:
                checked += 1
                if not close(value, got[step]):
                    errors.append("%s step %d: %r in TensorBoard, %r in metrics.jsonl"
                                  % (tag, step, got[step], value))
    for e in errors:
        print("tb_read: " + e)
    print("tb_read: %d files, %d tags, %d values checked" % (len(files), len(tags), checked))
    return 1 if errors or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
