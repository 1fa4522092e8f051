#!/usr/bin/env python3
"""Plots bench/cluster_bench.sh's JSON lines as the seeds' scaling figure.

  python3 bench/plot_cluster.py RESULTS.jsonl -o cluster.png

Top: training throughput (samples/s, bars) per number of workers, one bar per mode, and each
mode's scaling efficiency (compute / step: the share of N times one worker's throughput, line,
right axis), as Figure 1 of the seed on parameter servers and Horovod draws them. Bottom: each
mode's step time over its bandwidth bound (1 is the link's limit). The wire case, if present,
draws the measured link efficiency as the floor the bottom panel can reach.
"""
import argparse
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "dist_sync_colocated": "PS, server on each worker host (S = N)",
    "dist_sync_1server": "PS, 1 server",
    "dist_sync_separate": "PS, S = N on own hosts",
    "dist_sync_2to1": "PS, S = 2N on own hosts",
    "horovod_gloo": "allreduce (Gloo)",
    "horovod_mpi": "allreduce (Open MPI)",
    "ddp": "PyTorch DDP (gloo)",
}


def read(path):
    cases, wire = collections.OrderedDict(), None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            if d.get("case") == "wire":
                wire = d
            elif "case" in d and "step_ms" in d:
                cases.setdefault(d["case"], {})[int(d["workers"])] = d
    return cases, wire


def plot(cases, wire, out, title):
    workers = sorted({n for by_n in cases.values() for n in by_n})
    modes = [m for m in LABELS if m in cases] + [m for m in cases if m not in LABELS]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / max(1, len(modes))
    right = top.twinx()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, mode in enumerate(modes):
        color = colors[i % len(colors)]
        xs = [workers.index(n) + (i - (len(modes) - 1) / 2) * width for n in cases[mode]]
        top.bar(xs, [d["samples_per_s"] for d in cases[mode].values()], width, color=color,
                label=LABELS.get(mode, mode))
        line_x = [workers.index(n) for n in cases[mode]]
        right.plot(line_x, [100 * d["efficiency"] for d in cases[mode].values()], "o-",
                   color=color, linewidth=1.2, markersize=4)
        bottom.plot(line_x, [d["step_ms"] / d["bound_ms"] for d in cases[mode].values()], "o-",
                    color=color, label=LABELS.get(mode, mode))
    top.set_ylabel("samples/s (bars)")
    right.set_ylabel("scaling efficiency, % (lines)")
    right.set_ylim(0, 105)
    top.legend(fontsize=8, loc="upper left")
    top.set_title(title)
    bottom.axhline(1.0, color="black", linewidth=0.8)
    if wire:
        floor = 1 / wire["link_efficiency"]
        bottom.axhline(floor, color="gray", linestyle="--", linewidth=0.8)
        bottom.text(len(workers) - 0.5, floor, " TCP's measured limit (wire)", va="bottom",
                    ha="right", fontsize=8, color="gray")
    bottom.set_ylabel("step / bandwidth bound")
    bottom.set_xlabel("workers (N)")
    bottom.set_xticks(range(len(workers)))
    bottom.set_xticklabels([str(n) for n in workers])
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="cluster_bench.sh's output (JSON lines)")
    parser.add_argument("-o", "--output", default="cluster.png")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    cases, wire = read(args.results)
    if not cases:
        sys.exit("plot_cluster: no cases in " + args.results)
    any_case = next(iter(next(iter(cases.values())).values()))
    title = args.title or "%s x%s, %s ms compute, %s Mbit/s links" % (
        any_case["model"], any_case["scale"], any_case["compute_ms"], any_case["link_mbit"])
    plot(cases, wire, args.output, title)
    print("plot_cluster: wrote " + args.output)


if __name__ == "__main__":
    main()
