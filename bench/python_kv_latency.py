#!/usr/bin/env python3
"""Latency of one pushpull from Python (dtrain.kv), for bench/python_bench.sh: the same case as
`kvstore_bench --ops pushpull --bytes N` times in C++ (the call to the end of wait, every worker
at once), so the difference is what the Python layer adds.

    dtrain launch -n 1 -s 1 -- python3 bench/python_kv_latency.py --bytes 4096

Rank 0 prints {"op":"pushpull","bytes","workers","servers"?,"median_ms","p90_ms","iterations"}.
"""

import argparse
import json
import time

import torch

import dtrain


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_sync")
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--iterations", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=100)
    args = p.parse_args()
    kv = dtrain.kv.create(args.kvstore)
    n = args.bytes // 4
    kv.init(0, torch.zeros(n))
    value, out = torch.ones(n), torch.empty(n)
    times = []
    for i in range(args.warmup + args.iterations):
        t0 = time.perf_counter()
        kv.pushpull(0, value, out=out).wait()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    if kv.rank == 0:
        print(json.dumps({"op": "pushpull", "bytes": args.bytes, "workers": kv.num_workers,
                          "median_ms": times[len(times) // 2] * 1e3,
                          "p90_ms": times[int(len(times) * 0.9)] * 1e3,
                          "iterations": len(times)}, separators=(",", ":")), flush=True)
    kv.close()


if __name__ == "__main__":
    main()
