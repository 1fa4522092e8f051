"""`python3 -m dtrain.ray.discover [--cpus-per-worker N] [--gpus-per-worker G]`: the host discovery
script of `dtrain launch --launcher ray`: one line `ADDRESS:SLOTS` for each live node of the Ray
cluster (found as Ray's clients find it: RAY_ADDRESS, else the one started on this machine), its
slots as many workers as its CPUs (and GPUs) hold. A node that dies drops out of the list, one that
joins comes in: the elastic job follows the cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any


def connect() -> None:
    """Joins the cluster as Ray's clients do (RAY_ADDRESS, else this machine's), quietly: the
    output of this module and of dtrain.ray._node_exec is the job's."""
    import ray

    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False,
             logging_level=logging.WARNING)


def slots(node: dict[str, Any], cpus_per_worker: float, gpus_per_worker: float) -> int:
    """How many workers of that many CPUs and GPUs the node's resources hold."""
    resources = node.get("Resources", {})
    n = int(resources.get("CPU", 0) // cpus_per_worker) if cpus_per_worker else sys.maxsize
    if gpus_per_worker:
        n = min(n, int(resources.get("GPU", 0) // gpus_per_worker))
    return n


def main() -> int:
    ap = argparse.ArgumentParser(prog="python3 -m dtrain.ray.discover", description=__doc__)
    ap.add_argument("--cpus-per-worker", type=float, default=1.0)
    ap.add_argument("--gpus-per-worker", type=float, default=0.0)
    args = ap.parse_args()
    import ray

    connect()
    try:
        for node in ray.nodes():
            n = slots(node, args.cpus_per_worker, args.gpus_per_worker) if node["Alive"] else 0
            if n > 0:
                print(f"{node['NodeManagerAddress']}:{n}")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
