#!/usr/bin/env python3
"""PyTorch DDP (gloo) on bench/step_bench's emulated training step, for bench/cluster_bench.sh.

The same parameter shapes (asked from ``step_bench --print-shapes``), the same emulated compute (a
third before backward, the rest spread over the layers in backward in proportion to their size,
asleep) and DDP's own bucketing and overlap of allreduce with backward. Run on every worker of an
allreduce job (``dtrain launch -s 0``): it reads the rank, the world size and rank 0's address from
the launcher's variables. Rank 0 prints one JSON line with step_bench's fields, mode "ddp".
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Compute:
    """The emulated accelerator's clock, as step_bench's: each short sleep ends at a due time that
    advances by the compute spent, so that wake-up delays do not add up over hundreds of layers."""

    due = time.perf_counter()

    @classmethod
    def start_step(cls):
        cls.due = max(cls.due, time.perf_counter())

    @classmethod
    def spend(cls, seconds):
        cls.due += seconds
        left = cls.due - time.perf_counter()
        if left > 0:
            time.sleep(left)


class EmulatedLayer(torch.autograd.Function):
    """Passes x through; in backward, spends the layer's share of compute and yields p's gradient."""

    @staticmethod
    def forward(ctx, x, p, backward_s):
        ctx.backward_s = backward_s
        ctx.shape = p.shape
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        Compute.spend(ctx.backward_s)
        return grad, torch.full(ctx.shape, 1e-3), None


class EmulatedModel(torch.nn.Module):
    def __init__(self, sizes, backward_ms):
        super().__init__()
        total = sum(sizes)
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n)) for n in sizes)
        self.backward_s = [backward_ms / 1e3 * n / total for n in sizes]

    def forward(self, x):
        for p, s in zip(self.weights, self.backward_s):
            x = EmulatedLayer.apply(x, p, s)
        return x.sum()


def add_step_arguments(parser):
    """The emulated step's options, as step_bench's (also bench/hvd_step.py's)."""
    parser.add_argument("--step-bench", required=True, help="the step_bench binary (for shapes)")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--compute-ms", type=float, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--link-mbit", type=float, default=0)
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="workers per host, for bound_ms (as step_bench)")


def layer_sizes(args):
    """The model's parameter sizes, in order, as step_bench lays them out."""
    shapes = json.loads(subprocess.run(
        [args.step_bench, "--model", args.model, "--scale", str(args.scale), "--print-shapes"],
        check=True, capture_output=True, text=True).stdout)
    return [t["elements"] for t in shapes]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser)
    args = parser.parse_args()
    sizes = layer_sizes(args)

    rank = int(os.environ["DTRAIN_NODE_RANK"])
    world = int(os.environ["DMLC_NUM_WORKER"])
    os.environ["MASTER_ADDR"] = os.environ["DMLC_PS_ROOT_URI"]
    os.environ["MASTER_PORT"] = os.environ["DMLC_PS_ROOT_PORT"]
    if os.environ.get("DMLC_INTERFACE"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ["DMLC_INTERFACE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    forward_ms = args.compute_ms / 3
    model = EmulatedModel(sizes, args.compute_ms - forward_ms)
    ddp = DDP(model)
    x = torch.ones(1)
    step_ms = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        Compute.start_step()  # the last step ended with DDP waiting for its allreduces
        Compute.spend(forward_ms / 1e3)
        ddp(x).backward()
        for p in model.weights:  # the update a real step makes with the averaged gradient
            p.grad = None
        if step >= args.warmup:
            step_ms.append((time.perf_counter() - start) * 1e3)
    dist.barrier()
    if rank == 0:
        print(json.dumps(step_report("ddp", world, args, sizes, step_ms)), flush=True)
    dist.destroy_process_group()


def step_report(mode, world, args, sizes, step_ms):
    """Rank 0's JSON fields, as step_bench's (also bench/hvd_step.py's)."""
    nbytes = 4.0 * sum(sizes)
    link_ms = 0.0
    hosts = max(1, world // args.ranks_per_host)
    if args.link_mbit > 0:  # bandwidth-optimal allreduce: 2 (H - 1) / H of the bytes per host
        link_ms = 2 * nbytes * (hosts - 1) / hosts * 8 / (args.link_mbit * 1e6) * 1e3
    median = statistics.median(step_ms)
    return {
        "mode": mode, "workers": world, "servers": 0, "ranks_per_host": args.ranks_per_host,
        "link_mbit": args.link_mbit,
        "model": args.model, "scale": args.scale, "params": sum(sizes), "bytes": nbytes,
        "compute_ms": args.compute_ms, "step_ms": median,
        "p90_ms": sorted(step_ms)[min(len(step_ms) - 1, int(0.9 * (len(step_ms) - 1) + 0.5))],
        "bound_ms": max(args.compute_ms, link_ms),
        "samples_per_s": world * args.batch / (median / 1e3),
        "efficiency": args.compute_ms / median}


if __name__ == "__main__":
    main()
