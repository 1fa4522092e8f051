#!/usr/bin/env python3
"""Horovod's DistributedOptimizer on bench/step_bench's emulated training step, for
bench/cluster_bench.sh: the same step as bench/ddp_step.py (its model, compute and timing), with
the gradients averaged by Horovod's API instead of DDP, from real Horovod (`--impl horovod`,
started by horovodrun or mpirun) or from dtrain (`--impl dtrain`, started by `dtrain launch -s 0`).
The optimizer's hooks allreduce each gradient as backward produces it, and each step ends when
all are averaged (`optimizer.synchronize()`). Rank 0 prints one JSON line with step_bench's fields,
mode "hvd_step_<impl>".
"""
import argparse
import importlib
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from ddp_step import (Compute, EmulatedModel, add_step_arguments, layer_sizes,  # noqa: E402
                      step_report)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=["horovod", "dtrain"], required=True)
    add_step_arguments(parser)
    args = parser.parse_args()
    hvd = importlib.import_module("horovod.torch" if args.impl == "horovod" else "dtrain.torch")
    hvd.init()
    torch.set_num_threads(1)

    sizes = layer_sizes(args)
    forward_ms = args.compute_ms / 3
    model = EmulatedModel(sizes, args.compute_ms - forward_ms)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters())
    x = torch.ones(1)
    step_ms = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        Compute.start_step()
        Compute.spend(forward_ms / 1e3)
        model(x).backward()
        optimizer.synchronize()  # every gradient averaged: what the update needs
        for p in model.weights:
            p.grad = None
        if step >= args.warmup:
            step_ms.append((time.perf_counter() - start) * 1e3)
    world = hvd.size()
    hvd.allreduce(torch.ones(1), name="hvd_step.done")
    if hvd.rank() == 0:
        print(json.dumps(step_report("hvd_step_" + args.impl, world, args, sizes, step_ms)),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
