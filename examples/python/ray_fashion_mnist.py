"""Horovod's PyTorch MNIST example (horovod_mnist.py, unchanged) on a Ray cluster, started by
dtrain's RayExecutor, Horovod's `horovod.ray` API: one Ray actor per rank, no hostfile, no ssh.

    pip install 'dtrain[ray]'
    python3 examples/python/ray_fashion_mnist.py --num-workers 2                # a local Ray
    python3 examples/python/ray_fashion_mnist.py --address auto -- --epochs 3   # a running cluster

Arguments after `--` go to horovod_mnist.py. Rank 0 prints "Epoch N: Test_acc X" (Ray prefixes
each actor's lines with its name and pid). Ray ships this folder to every actor (its
runtime_env's working_dir), so the script and fashion_mnist.py are importable there; the data is
read from each node's Debian dataset-fashion-mnist (--data-dir to change it).
"""

import argparse
import os
import sys

import ray

from dtrain.ray import RayExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def train(argv):
    import horovod_mnist  # from the working_dir Ray unpacked for this actor

    sys.argv = ["horovod_mnist.py", *argv]
    horovod_mnist.main()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--cpus-per-worker", type=int, default=1)
    ap.add_argument("--address", default=None, help="a running cluster's (default: start one)")
    ap.add_argument("train_args", nargs="*", help="horovod_mnist.py's, after --")
    args = ap.parse_args()

    # "local": a new Ray on this machine, never one that a `ray start` here left running.
    ray.init(address=args.address or "local", runtime_env={"working_dir": HERE})
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120),
                           num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker)
    executor.start()
    try:
        executor.run(train, args=[args.train_args])
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
