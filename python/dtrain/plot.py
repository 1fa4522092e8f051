"""Plots of training runs: ``dtrain plot LOG [LOG...] -o FILE.png [--timeline TRACE]``
(or ``python3 -m dtrain.plot ...``).

From each log (the output of dtrain-train or of a script printing the same lines, with or without
dtrain launch's ``[worker N]`` prefixes) it draws, per epoch, the training accuracy and the test
accuracy, the loss (cross-entropy) and the samples/s of one worker (``--worker``, default 0); the
logs overlay, for comparing runs. The lines it reads:

    Epoch[0] Batch [0-100] Speed: 5210.3 samples/sec accuracy=0.52 cross-entropy=1.31
    Epoch 0: Test_acc 0.871300

With ``--timeline TRACE`` (a merged DTRAIN_TIMELINE file) it adds, for that worker, where each
step's time went: forward, backward, waiting for weights and the optimizer step.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypedDict

    class _Epoch(TypedDict):
        speed: list[float]
        accuracy: list[float]
        loss: list[float]
        test: float | None

_PREFIX = re.compile(r"^\[(worker|rank) (\d+)\] ?")
_PROGRESS = re.compile(r"Epoch\[(\d+)\] Batch \[\d+-\d+\] Speed: ([0-9.]+) samples/sec"
                       r"(?:.*?accuracy=([0-9.]+))?(?:.*?cross-entropy=([0-9.]+))?")
_TEST = re.compile(r"Epoch (\d+): Test_acc ([0-9.]+)")


def read_log(path: str, worker: int) -> dict[int, _Epoch]:
    """{epoch: {"speed": [...], "accuracy": [...], "loss": [...], "test": x}} of one worker."""
    epochs: collections.defaultdict[int, _Epoch] = collections.defaultdict(
        lambda: {"speed": [], "accuracy": [], "loss": [], "test": None})
    with open(path, errors="replace") as f:
        for line in f:
            m = _PREFIX.match(line)
            if m:
                if int(m.group(2)) != worker:
                    continue
                line = line[m.end():]
            p = _PROGRESS.search(line)
            if p:
                e = epochs[int(p.group(1))]
                e["speed"].append(float(p.group(2)))
                if p.group(3):
                    e["accuracy"].append(float(p.group(3)))
                if p.group(4):
                    e["loss"].append(float(p.group(4)))
                continue
            t = _TEST.search(line)
            if t:
                epochs[int(t.group(1))]["test"] = float(t.group(2))
    return dict(sorted(epochs.items()))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def step_breakdown(trace_path: str, worker: int) -> list[tuple[int, dict[str, float]]]:
    """[(step, {span name: ms})] of one worker from a merged timeline."""
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    pid = None
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name" and \
                e.get("args", {}).get("name") == "worker %d" % worker:
            pid = e["pid"]
    steps: collections.defaultdict[int, collections.defaultdict[str, float]] = \
        collections.defaultdict(lambda: collections.defaultdict(float))
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "train" or (pid is not None and e.get("pid") != pid):
            continue
        step = e.get("args", {}).get("step")
        if step is not None:
            steps[step][e["name"]] += e.get("dur", 0) / 1000.0
    for spans in steps.values():  # the waits for weights happen inside forward: count them once
        if "forward" in spans:
            spans["forward"] = max(0.0, spans["forward"] - spans.get("wait_weights", 0.0))
    return sorted(steps.items())


def plot(logs: Sequence[str], output: str, worker: int = 0,
         timeline: str | None = None) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = 4 if timeline else 3
    fig, axes = plt.subplots(rows, 1, figsize=(8, 3 * rows), constrained_layout=True)
    drawn = 0
    for path in logs:
        epochs = read_log(path, worker)
        if not epochs:
            print("dtrain plot: no progress lines of worker %d in %s" % (worker, path),
                  file=sys.stderr)
            continue
        drawn += 1
        xs = list(epochs)
        label = path.rsplit("/", 1)[-1]
        train_acc = [_mean(e["accuracy"]) for e in epochs.values()]
        test_acc = [e["test"] for e in epochs.values()]
        line, = axes[0].plot(xs, train_acc, marker="o", linestyle="--", label=label + " train")
        axes[0].plot(xs, test_acc, marker="s", color=line.get_color(), label=label + " test")
        axes[1].plot(xs, [_mean(e["loss"]) for e in epochs.values()], marker="o", label=label)
        axes[2].plot(xs, [_mean(e["speed"]) for e in epochs.values()], marker="o", label=label)
    if drawn == 0:
        raise SystemExit("dtrain plot: nothing to draw")
    for ax, title in zip(axes, ("accuracy", "loss (cross-entropy per sample)",
                                "samples/s (worker %d)" % worker)):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize="small")
    if timeline:
        steps = step_breakdown(timeline, worker)
        if not steps:
            raise SystemExit("dtrain plot: no training steps of worker %d in %s" % (worker, timeline))
        names = [n for n in ("forward", "backward", "wait_weights", "step")
                 if any(n in s for _, s in steps)]
        ax = axes[3]
        # Stacked areas rather than bars: thousands of steps draw in a fraction of the time.
        ax.stackplot(range(len(steps)), *[[s.get(name, 0.0) for _, s in steps] for name in names],
                     labels=names, step="mid")
        ax.set_title("where each step's time went (worker %d, ms)" % worker)
        ax.set_xlabel("step")
        ax.legend(fontsize="small")
    fig.savefig(output, dpi=100)
    return output


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="dtrain plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="training logs")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--worker", type=int, default=0, help="whose lines to draw")
    ap.add_argument("--timeline", help="a merged DTRAIN_TIMELINE trace")
    args = ap.parse_args(argv)
    print("dtrain plot: wrote %s" % plot(args.logs, args.output, args.worker, args.timeline))


if __name__ == "__main__":
    main()
