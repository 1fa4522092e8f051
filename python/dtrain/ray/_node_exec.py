"""`python3 -m dtrain.ray._node_exec --node ADDRESS -- ARGV...`: one worker of `dtrain launch
--launcher ray` (src/launcher/run/elastic_launcher.cc starts this proxy on the launcher's machine).

It asks Ray for an actor on the node at ADDRESS (hard node affinity) and runs ARGV there as a child
process of a dtrain._engine_child.ChildRunner, with the job's variables and files as that module
says. The child's output comes back line by line and is printed here, where the launcher merges
it; this proxy exits with the child's code.

It stops the child (SIGTERM, then SIGKILL 5 s later) when the launcher closes its stdin or
signals it; if this proxy is killed outright, Ray ends the actors its driver owned, and the child
dies with its actor (PR_SET_PDEATHSIG). When Ray loses the actor or its node, the proxy says so,
naming the node, and exits 1. DTRAIN_RAY_CPUS and DTRAIN_RAY_GPUS (default 1 and 0): the actor's
resources.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from .._engine_child import LOST, STOP_GRACE_S, ChildRunner, ProxyJob, stop_on_eof_or_signal


def _node_id(address: str) -> str:
    import ray

    for node in ray.nodes():
        if node["Alive"] and node["NodeManagerAddress"] == address:
            return str(node["NodeID"])
    raise SystemExit(f"dtrain.ray: no live Ray node at {address} (`ray status` lists the nodes)")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python3 -m dtrain.ray._node_exec")
    ap.add_argument("--node", required=True, help="the Ray node's address")
    ap.add_argument("--cpus", type=float, default=float(os.environ.get("DTRAIN_RAY_CPUS", 1)))
    ap.add_argument("--gpus", type=float, default=float(os.environ.get("DTRAIN_RAY_GPUS", 0)))
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        ap.error("no command after --")

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .discover import connect

    connect()
    runner_class: Any = ray.remote(ChildRunner)
    runner = runner_class.options(
        num_cpus=args.cpus, num_gpus=args.gpus, max_concurrency=2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(_node_id(args.node), soft=False)
    ).remote()
    stopping = stop_on_eof_or_signal(
        lambda: ray.get(runner.stop.remote(), timeout=STOP_GRACE_S + 5))
    job = ProxyJob()
    code = LOST
    try:
        for ref in runner.run.options(num_returns="streaming").remote(argv, job.env,
                                                                       job.fn_bytes):
            exit_code = job.take(*ray.get(ref))
            if exit_code is not None:
                code = exit_code
    except ray.exceptions.RayError as e:
        if stopping.is_set():
            return 128 + signal.SIGTERM
        print(f"dtrain.ray: the worker's actor on node {args.node} was lost: "
              f"{str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return LOST
    return code


if __name__ == "__main__":
    sys.exit(main())
