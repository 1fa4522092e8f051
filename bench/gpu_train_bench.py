#!/usr/bin/env python3
"""ResNet-18 training on one GPU: dtrain-train against plain PyTorch and PyTorch DDP, in one run.

    python3 bench/gpu_train_bench.py --build build-gpu

Seven jobs, each ResNet-18 (dtrain's, src/train/models/resnet.cc; bench/gpu_train.py has the same
network in PyTorch) on CIFAR-shaped synthetic images, batch 128 per worker, SGD (lr 0.05, momentum
0.9), every process on GPU 0:
  plain       one PyTorch process, no communication (bench/gpu_train.py plain)
  dtrain 1x1  dtrain-train --gpus 0, 1 worker and 1 server (dist_sync: gradients to the server,
              weights back, every step)
  dtrain 1x1 worker update
              the same with --update-on-kvstore 0: the server sums, the worker's GPU updates
  dtrain 1x1 server threads
              dtrain 1x1 with the server's update of big keys over half the machine's cores
  dtrain 1x1 apply on receive
              dtrain 1x1 with the server applying on its network threads (DTRAIN_APPLY_THREADS=0)
  ddp 2       2 PyTorch processes, DistributedDataParallel over gloo with CUDA tensors
  dtrain 2x2  dtrain-train --gpus 0, 2 workers and 2 servers
--jobs picks some of them, or adds ones that split dtrain's cost: dtrain_local (one process,
--kvstore local: the staging and the optimizer on the GPU, no network or server),
dtrain_local_store_update (the same with the optimizer in the store, which updates one replica's
CUDA values on the GPU too, as MXNet's local store does),
dtrain_1x1_no_overlap (gradients leave at step(), not during backward),
dtrain_1x2 (1 worker, 2 servers), dtrain_1x1_traced (dtrain_1x1 writing a timeline,
DTRAIN_TIMELINE, into --timeline-dir), dtrain_1x1_apply_on_receive (dtrain_1x1 with
DTRAIN_APPLY_THREADS=0: the server's network threads apply what they receive, as before
2026-12-02, against dtrain_1x1's threads of their own). dtrain_1x1_server_threads sets
MXNET_KVSTORE_REDUCTION_NTHREADS (default 4) to half the cores: the server's update was the
longest part of a 1x1 step.
samples/s: per process the median of its timing windows after the first, summed over processes.
Prints one JSON line per job and one with the ratios (dtrain 1x1 / plain, dtrain 2x2 / ddp 2).
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SPEED = re.compile(r"^(?:\[worker (\d+)\] )?.*Speed: ([0-9.]+) samples/sec")


def dtrain_speed(output):
    """Aggregate samples/s from dtrain-train's progress lines (prefixed per worker by dtrain
    launch): per worker the median of its windows after the first, summed."""
    windows = {}
    for line in output.splitlines():
        m = SPEED.match(line)
        if m:
            windows.setdefault(m.group(1) or "0", []).append(float(m.group(2)))
    per_worker = [statistics.median(w[1:] or w) for w in windows.values()]
    return sum(per_worker), per_worker


# The job running now: its process group is its own (start_new_session), so a signal to this
# benchmark (gpu-check.sh's timeout) reaches it only through main's stop handler.
_current = None


def run(cmd, timeout, env=None):
    """The command's output; its whole process group is killed if it outlives `timeout`. `env`:
    variables added to this process's environment."""
    global _current
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})
    _current = proc
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        sys.stderr.write(out[-4000:])
        raise SystemExit(f"gpu_train_bench: {cmd[0]} ran past {timeout:.0f} s")
    if proc.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit(f"gpu_train_bench: {cmd[0]} exited {proc.returncode}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="the build folder with dtrain and dtrain-train")
    p.add_argument("--steps", type=int, default=100, help="per worker")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--timeout", type=float, default=120, help="seconds per job")
    p.add_argument("--timeline-dir", default=".", help="where dtrain_1x1_traced writes its trace")
    p.add_argument("--jobs", default="plain,dtrain_1x1,dtrain_1x1_worker_update,"
                   "dtrain_1x1_server_threads,dtrain_1x1_apply_on_receive,ddp_2,dtrain_2x2",
                   help="comma-separated, run in this order")
    args = p.parse_args()
    launcher = os.path.join(args.build, "src/tools/dtrain")
    trainer = os.path.join(args.build, "src/train/dtrain-train")
    common = ["--steps", str(args.steps), "--batch-size", str(args.batch_size),
              "--log-interval", str(args.log_interval)]
    results = {}

    def reference(name, mode, *extra):
        out = run([sys.executable, os.path.join(HERE, "gpu_train.py"), mode, *common, *extra],
                  args.timeout)
        line = json.loads(out.strip().splitlines()[-1])
        results[name] = line["samples_per_s"]
        print(json.dumps({"job": name, **line}), flush=True)

    def dtrain(name, workers, *extra, servers=None, env=None):
        servers = workers if servers is None else servers
        job = [launcher, "launch", "-n", str(workers), "-s", str(servers), "--launcher", "local",
               "--"] if workers else []
        cmd = job + [trainer, "--dataset", "synthetic", "--network", "resnet18", "--gpus", "0",
                     "--epochs", "1", "--batch-size", str(args.batch_size),
                     "--limit-train", str(max(1, workers) * args.steps * args.batch_size),
                     "--log-interval", str(args.log_interval), "--optimizer", "sgd", "--lr",
                     "0.05", "--momentum", "0.9",
                     "--kvstore", "dist_sync" if workers else "local", *extra]
        out = run(cmd, args.timeout, env)
        total, per_worker = dtrain_speed(out)
        acc = re.findall(r"Test_acc ([0-9.]+)", out)
        results[name] = total
        print(json.dumps({"job": name, "workers": max(1, workers), "servers": servers,
                          "samples_per_s": round(total, 1),
                          "per_process": [round(s, 1) for s in per_worker],
                          "test_acc": float(acc[-1]) if acc else None}), flush=True)

    jobs = {
        "plain": lambda: reference("plain", "plain"),
        "dtrain_1x1": lambda: dtrain("dtrain_1x1", 1),
        "ddp_2": lambda: reference("ddp_2", "ddp", "--workers", "2"),
        "dtrain_2x2": lambda: dtrain("dtrain_2x2", 2),
        "dtrain_local": lambda: dtrain("dtrain_local", 0),
        "dtrain_local_store_update": lambda: dtrain("dtrain_local_store_update", 0,
                                                    "--update-on-kvstore", "1"),
        "dtrain_1x1_worker_update": lambda: dtrain("dtrain_1x1_worker_update", 1,
                                                   "--update-on-kvstore", "0"),
        "dtrain_1x1_no_overlap": lambda: dtrain("dtrain_1x1_no_overlap", 1, "--no-overlap"),
        "dtrain_1x2": lambda: dtrain("dtrain_1x2", 1, servers=2),
        "dtrain_1x1_server_threads": lambda: dtrain("dtrain_1x1_server_threads", 1, env={
            "MXNET_KVSTORE_REDUCTION_NTHREADS": str(max(4, (os.cpu_count() or 8) // 2))}),
        "dtrain_1x1_apply_on_receive": lambda: dtrain("dtrain_1x1_apply_on_receive", 1,
                                                      env={"DTRAIN_APPLY_THREADS": "0"}),
        "dtrain_1x1_traced": lambda: dtrain("dtrain_1x1_traced", 1, env={
            "DTRAIN_TIMELINE": os.path.abspath(os.path.join(args.timeline_dir,
                                                            "dtrain_1x1.json"))}),
    }
    def print_ratios():
        ratios = {}
        for ours, theirs, target in (("dtrain_1x1", "plain", 0.9), ("dtrain_2x2", "ddp_2", 1.2),
                                     ("dtrain_1x1_worker_update", "plain", 0.9),
                                     ("dtrain_1x1_server_threads", "plain", 0.9),
                                     ("dtrain_1x1_apply_on_receive", "plain", 0.9),
                                     ("dtrain_local", "plain", None),
                                     ("dtrain_local_store_update", "plain", None)):
            if ours in results and theirs in results:
                ratios[f"{ours}_vs_{theirs}"] = {
                    "ratio": round(results[ours] / results[theirs], 3), "target": target}
        print(json.dumps({"job": "ratios", **ratios}), flush=True)

    def stop(signum, frame):
        # Cut short (gpu-check.sh's bound): the job running goes too, and the jobs done still
        # give their ratios.
        if _current is not None and _current.poll() is None:
            os.killpg(_current.pid, signal.SIGKILL)
        print_ratios()
        raise SystemExit(f"gpu_train_bench: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for name in args.jobs.split(","):
        if name not in jobs:
            raise SystemExit(f"gpu_train_bench: no job {name!r}; known: {', '.join(jobs)}")
        jobs[name]()
    print_ratios()


if __name__ == "__main__":
    main()
