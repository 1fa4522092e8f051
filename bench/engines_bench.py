"""One script, three ways to start it: Horovod's Fashion-MNIST example (examples/python/
horovod_mnist.py) with N ranks under `dtrain launch`, under Ray (examples/python/
ray_fashion_mnist.py: RayExecutor on a local Ray) and under Spark (examples/python/
spark_fashion_mnist.py: dtrain.spark.run on local[N]), in the same run: each one's Test_acc, its
training speed (samples/s of rank 0's speed lines, the mean over the run) and its wall time, and
the ratios to `dtrain launch`. Then a job's start on a running Ray (RayExecutor.start to the
end of the first allreduce, 2 and 4 workers by default), the median of a few starts.

    build/venv/torch2/bin/python bench/engines_bench.py [--ranks 2] [--epochs 2] [--starts 5]

Needs dtrain with the [ray] and [spark] extras in the running Python (scripts/test-pip.sh makes
such a venv: build/venv/torch2) and a Java runtime. Prints a Markdown table for
docs/performance.md."""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples", "python")
SPEED = re.compile(r"Speed: ([0-9.]+) samples/sec")
ACC = re.compile(r"Epoch (\d+): Test_acc ([0-9.]+)")


def run(name, argv, timeout):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "RAY_", "SPARK_"))}
    start = time.monotonic()
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    wall = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"{name} failed ({p.returncode}):\n{p.stdout[-4000:]}")
    accs = [float(a) for _, a in ACC.findall(p.stdout)]
    speeds = [float(s) for s in SPEED.findall(p.stdout)]
    if not accs or not speeds:
        sys.exit(f"{name}: no Test_acc or speed lines:\n{p.stdout[-4000:]}")
    return {"acc": accs[-1], "speed": statistics.mean(speeds), "wall": wall}


def ray_start_times(workers, starts):
    import ray
    import torch

    from dtrain.ray import RayExecutor

    def first_allreduce():
        import dtrain.torch as hvd

        hvd.init()
        hvd.allreduce(torch.ones(1))
        hvd.shutdown()

    ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False)
    times = []
    try:
        for _ in range(starts):
            t0 = time.monotonic()
            executor = RayExecutor(num_workers=workers)
            executor.start()
            try:
                executor.run(first_allreduce)
                times.append(time.monotonic() - t0)
            finally:
                executor.shutdown()
    finally:
        ray.shutdown()
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--starts", type=int, default=5, help="Ray starts to time (0: none)")
    ap.add_argument("--start-workers", default="2,4",
                    help="comma-separated worker counts whose starts to time")
    args = ap.parse_args()
    py = sys.executable
    dtrain = shutil.which("dtrain", path=os.path.dirname(py) + os.pathsep + os.environ["PATH"])
    train = ["--epochs", str(args.epochs)]
    n = str(args.ranks)
    timeout = 600 * args.epochs
    results = {
        "dtrain launch": run("dtrain launch", [dtrain, "launch", "-n", n, "-s", "0", "--launcher",
                                               "local", "--", py,
                                               os.path.join(EXAMPLES, "horovod_mnist.py"),
                                               *train], timeout),
        "Ray (RayExecutor)": run("ray", [py, os.path.join(EXAMPLES, "ray_fashion_mnist.py"),
                                         "--num-workers", n, "--", *train], timeout),
        "Spark (dtrain.spark.run)": run("spark", [py, os.path.join(EXAMPLES,
                                                                   "spark_fashion_mnist.py"),
                                                  "--num-proc", n, "--master", f"local[{n}]",
                                                  "--", *train], timeout),
    }
    base = results["dtrain launch"]
    print(f"\n{args.ranks} ranks, {args.epochs} epochs of horovod_mnist.py (LeNet, Fashion-MNIST)\n")
    print("| started by | Test_acc | vs launch (points) | samples/s | vs launch | wall s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['acc']:.4f} | {100 * (r['acc'] - base['acc']):+.2f} | "
              f"{r['speed']:.0f} | {r['speed'] / base['speed']:.2f} | {r['wall']:.1f} |")
    for workers in [int(w) for w in args.start_workers.split(",")] if args.starts else []:
        times = ray_start_times(workers, args.starts)
        print(f"\nRayExecutor start to the first allreduce's end, {workers} workers on a running "
              f"local Ray ({os.cpu_count()} cores): median {statistics.median(times):.2f} s "
              f"(each: {', '.join('%.2f' % t for t in times)})")


if __name__ == "__main__":
    main()
