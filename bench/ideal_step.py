#!/usr/bin/env python3
"""The step time of bench/step_bench.cc's step on an ideal network with priority scheduling: a
tighter bound than its bound_ms, which assumes the communication can hide entirely behind the
compute.

  python3 bench/ideal_step.py --workers 8 --link-mbit 467 --compute-ms 300
  python3 bench/ideal_step.py --workers 4 --link-mbit 187 --compute-ms 200 --model resnet50

step_bench spends a third of --compute-ms on forward and the rest on backward, each layer's share in
proportion to its size; backward produces the gradients last layer first, and the next forward needs
each layer's new value before it runs that layer. This replays that step against an ideal network,
for the colocated layout (a server on each of N hosts) and, with the same bytes, for ring allreduce:
every host sends (N - 1) / N of each gradient out (the push, or reduce-scatter) and, once that has
arrived, the same again (the reply, or allgather); each host's outgoing link, at --link-mbit, is the
only limit (incoming links carry the same by symmetry; no CPU, and no latency but --turnaround-ms's)
and always sends the layer nearest the input first, interrupting a bigger one. It runs 12 steps and
prints one JSON line for the last: ideal_ms, the efficiency compute_ms / ideal_ms, and wire_ms (the
bytes alone at the link's rate). At the links' nominal rate this is a floor for the measured step;
at the rate cluster_bench's wire case measures (one TCP stream each way) it is an estimate, which
dtrain has beaten by a few percent at N = 2. --turnaround-ms T delays each reply's start by T after
its push has gone and each value's return by T after its reply has gone (queues, latency, the wait
for the last worker's push): what any real network adds to ideal_ms.

It also prints fair_ms, the same step with no priority on the links: every layer whose push (or
reply) is under way gets an equal share of the link, as when each is its own TCP flow and the
flows share the links fairly; a layer's reply starts once its whole push has gone. Measured steps
lie between the two: at ideal_ms where the links are the bottleneck, near fair_ms where compute
and communication are about equal (docs/performance.md), since priority set by a sender orders
only what waits in its own queues, not what the network's queues and the other hosts' flows hold.

And batch_ms, the step of allreduce mode's engine (src/collectives/engine/engine.cc) on the same ideal
links: whole tensors, fused in priority order up to --fusion-bytes from those ready when a batch
starts, one batch at a time, each taking --batch-overhead-ms (its negotiation round and the
collective's latency) plus its bytes, reduce-scatter and allgather, at the link's rate; no batch
is interrupted. With no overhead it says what running whole batches costs against ideal_ms.
"""
import argparse
import heapq
import json
import os
import subprocess
import sys


def layer_bytes(args):
    step_bench = os.path.join(args.build, "bench", "step_bench")
    out = subprocess.run([step_bench, "--print-shapes", "--model", args.model,
                          "--scale", str(args.scale)], check=True, capture_output=True, text=True)
    return [t["elements"] * 4 for t in json.loads(out.stdout)]


def pieces_of(size, piece_bytes):
    whole, rest = divmod(size, piece_bytes)
    return [piece_bytes] * whole + ([rest] if rest else [])


def send(link_free, produced, pieces, rate, turnaround_ms=0.0):
    """One link carrying each piece's push from when its layer is produced and its reply from
    turnaround_ms after that push has gone, the lowest (layer, piece, phase) first, preemptively; a
    reply is back turnaround_ms after it has gone. pieces: layer -> list of piece sizes. Returns
    when each layer's last reply is back, and when the link is free."""
    left = {(k, i, phase): b for k, sizes in pieces.items() for i, b in enumerate(sizes)
            for phase in (0, 1)}
    arrivals = [(produced[k], (k, i, 0)) for k, sizes in pieces.items() for i in range(len(sizes))]
    heapq.heapify(arrivals)
    back = dict.fromkeys(pieces, 0.0)
    clock, waiting, sent = link_free, [], 0
    while sent < len(left):
        while arrivals and arrivals[0][0] <= clock:
            heapq.heappush(waiting, heapq.heappop(arrivals)[1])
        if not waiting:
            clock = arrivals[0][0]
            continue
        item = waiting[0]
        arrival = arrivals[0][0] if arrivals else float("inf")
        finish = clock + left[item] / rate
        if finish <= arrival:
            heapq.heappop(waiting)
            clock = finish
            sent += 1
            k, i, phase = item
            if phase == 0:
                heapq.heappush(arrivals, (clock + turnaround_ms, (k, i, 1)))
            else:
                back[k] = max(back[k], clock + turnaround_ms)
        else:  # something arrives first: it may outrank this one
            left[item] -= (arrival - clock) * rate
            clock = arrival
    return back, clock


def send_fair(link_free, produced, layer_bytes, rate):
    """One link shared equally by every layer in flight: a layer's push from when it is produced,
    its reply from when that push has gone (processor sharing, no priority). layer_bytes: layer ->
    bytes each way. Returns when each layer's reply has gone, and when the link is free."""
    arrivals = sorted((t, k) for k, t in produced.items())
    left, back = {}, {}
    clock, nxt = link_free, 0
    while len(back) < len(layer_bytes):
        while nxt < len(arrivals) and arrivals[nxt][0] <= clock:
            left[(arrivals[nxt][1], 0)] = layer_bytes[arrivals[nxt][1]]
            nxt += 1
        if not left:
            clock = arrivals[nxt][0]
            continue
        share = rate / len(left)
        arrival = arrivals[nxt][0] if nxt < len(arrivals) else float("inf")
        dt = min(min(left.values()) / share, arrival - clock)
        clock += dt
        for item in list(left):
            left[item] -= dt * share
            if left[item] <= 1e-9 * max(1.0, layer_bytes[item[0]]):
                del left[item]
                k, phase = item
                if phase == 0:
                    left[(k, 1)] = layer_bytes[k]
                else:
                    back[k] = clock
    return back, clock


def send_batches(link_free, produced, sizes, rate, share, fusion_bytes, overhead_ms):
    """One link carrying allreduce batches: each starts once the link is free and a layer is ready,
    takes the nearest layers to the input among those ready then, whole, up to fusion_bytes (at
    least one), and lasts overhead_ms plus both phases' bytes (2 x share x size) at the rate.
    Returns when each layer's batch ends, and when the link is free."""
    left, back, clock = set(produced), {}, link_free
    while left:
        ready = sorted(k for k in left if produced[k] <= clock)
        if not ready:
            clock = min(produced[k] for k in left)
            continue
        batch, fused = [], 0
        for k in ready:
            if batch and fused + sizes[k] > fusion_bytes:
                break
            batch.append(k)
            fused += sizes[k]
        clock += overhead_ms + 2 * share * fused / rate
        for k in batch:
            back[k] = clock
            left.discard(k)
    return back, clock


def ideal_step(sizes, workers, link_mbit, compute_ms, piece_bytes, steps=12, sharing="priority",
               fusion_bytes=1 << 20, batch_overhead_ms=0.0, turnaround_ms=0.0):
    """The step time; sharing "priority" (the nearest layer to the input first, preemptive, in
    pieces; turnaround_ms between a push leaving and its reply starting, and between a reply
    leaving and its value being back), "fair" (every layer in flight an equal share) or "batches"
    (allreduce mode's engine: whole fused batches, fusion_bytes and batch_overhead_ms each)."""
    rate = link_mbit * 1e6 / 8 / 1e3  # bytes per ms
    total = sum(sizes)
    share = (workers - 1) / workers
    forward, backward = compute_ms / 3, compute_ms - compute_ms / 3
    layers = range(len(sizes))
    value_back = [0.0] * len(sizes)  # when each layer's new value is back
    clock, link_free, starts = 0.0, 0.0, []
    for _ in range(steps):
        starts.append(clock)
        for k in layers:  # forward, first layer first, each waiting for its value
            clock = max(clock, value_back[k]) + forward * sizes[k] / total
        produced = {}
        for k in reversed(layers):  # backward, last layer first
            clock += backward * sizes[k] / total
            produced[k] = clock
        if sharing == "batches":
            back, link_free = send_batches(link_free, produced, sizes, rate, share, fusion_bytes,
                                           batch_overhead_ms)
        elif sharing == "fair":
            back, link_free = send_fair(link_free, produced, {k: share * sizes[k] for k in layers},
                                        rate)
        else:
            pieces = {k: [share * b for b in pieces_of(sizes[k], piece_bytes)] for k in layers}
            back, link_free = send(link_free, produced, pieces, rate, turnaround_ms)
        value_back = [back[k] for k in layers]
    return starts[-1] - starts[-2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--link-mbit", type=float, required=True)
    parser.add_argument("--compute-ms", type=float, required=True)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--piece-bytes", type=int, default=16384,
                        help="values travel in pieces this big (smaller: closer to a fluid)")
    parser.add_argument("--fusion-bytes", type=int, default=1 << 20,
                        help="batch_ms: the fusion threshold (HOROVOD_FUSION_THRESHOLD)")
    parser.add_argument("--batch-overhead-ms", type=float, default=0.0,
                        help="batch_ms: what each batch costs beyond its bytes")
    parser.add_argument("--turnaround-ms", type=float, default=0.0,
                        help="ideal_ms: the time from a push leaving to its reply starting, and "
                             "from a reply leaving to its value being back (latency, queues, the "
                             "wait for the last worker's push); 0: the floor")
    parser.add_argument("--build", default="build")
    args = parser.parse_args()
    if (args.workers < 1 or args.link_mbit <= 0 or args.compute_ms < 0 or args.piece_bytes < 1
            or args.fusion_bytes < 1 or args.batch_overhead_ms < 0 or args.turnaround_ms < 0):
        sys.exit("ideal_step: --workers >= 1, --link-mbit > 0, --compute-ms >= 0,"
                 " --piece-bytes >= 1, --fusion-bytes >= 1, --batch-overhead-ms >= 0,"
                 " --turnaround-ms >= 0")
    sizes = layer_bytes(args)
    ideal = ideal_step(sizes, args.workers, args.link_mbit, args.compute_ms, args.piece_bytes,
                       turnaround_ms=args.turnaround_ms)
    fair = ideal_step(sizes, args.workers, args.link_mbit, args.compute_ms, args.piece_bytes,
                      sharing="fair")
    batches = ideal_step(sizes, args.workers, args.link_mbit, args.compute_ms, args.piece_bytes,
                         sharing="batches", fusion_bytes=args.fusion_bytes,
                         batch_overhead_ms=args.batch_overhead_ms)
    share = (args.workers - 1) / args.workers
    wire = 2 * share * sum(sizes) / (args.link_mbit * 1e6 / 8 / 1e3)
    print(json.dumps({"model": args.model, "scale": args.scale, "workers": args.workers,
                      "link_mbit": args.link_mbit, "compute_ms": args.compute_ms,
                      "wire_ms": round(wire, 1), "turnaround_ms": args.turnaround_ms,
                      "ideal_ms": round(ideal, 1),
                      "efficiency": round(args.compute_ms / ideal, 3) if ideal else 1.0,
                      "fair_ms": round(fair, 1),
                      "fair_efficiency": round(args.compute_ms / fair, 3) if fair else 1.0,
                      "batch_ms": round(batches, 1), "fusion_bytes": args.fusion_bytes,
                      "batch_overhead_ms": args.batch_overhead_ms,
                      "batch_efficiency": round(args.compute_ms / batches, 3) if batches else 1.0}))


if __name__ == "__main__":
    main()
