"""Real Horovod 0.28.1 beside dtrain, on one host, alternated in one run: the same allreduce loop
and the same fused allreduce of a ResNet-50's gradient list (bench/horovod_rank.py), and the same
MNIST script (examples/python/horovod_mnist.py with only its import line switched), over Gloo
(`horovodrun --gloo` / `dtrain launch -s 0`) and over Open MPI (`mpirun`, both).

    python3 bench/horovod_bench.py [--ranks 2] [--repeat 3] [--cases allreduce,resnet50,mnist]
        [--transports gloo,mpi] [--sizes-kb 4,1024,4096,16384,65536] [--iterations 20]
        [--mnist-batches 0] [--horovod yes|built|no]

Horovod comes from bench/horovod_venv.sh (built once into build/venv/horovod, about 15 minutes;
skipped with its reason where PyPI cannot be reached, or with --horovod no, and then only
dtrain's figures are printed). Prints one JSON line per run and a table of medians: milliseconds (lower is
better) or samples/s, dtrain's speedup over Horovod, and the physical bound beside them (two
memcpy passes of the bytes: what one host's reduction must at least move).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUILD = os.path.join(REPO, "build")
DTRAIN = os.environ.get("DTRAIN", os.path.join(BUILD, "src", "tools", "dtrain"))
RANK = os.path.join(HERE, "horovod_rank.py")
EXAMPLE = os.path.join(REPO, "examples", "python", "horovod_mnist.py")
SPEED = re.compile(r"Epoch\[0\] Batch \[\d+-(\d+)\] Speed: ([\d.]+) samples/sec")


def horovod_python(mode):
    """The Horovod venv's python, or None and why not. mode: yes (build it if needed), built
    (only if built already: the test's quick run), no."""
    if mode == "no":
        return None, "--horovod no"
    venv_python = os.path.join(BUILD, "venv", "horovod", "bin", "python")
    if mode == "built" and not os.path.exists(os.path.join(BUILD, "venv", "horovod", "bin",
                                                           "horovodrun")):
        return None, "not built yet (bash bench/horovod_venv.sh, or --horovod yes)"
    p = subprocess.run(["bash", os.path.join(HERE, "horovod_venv.sh"),
                        os.path.dirname(os.path.dirname(venv_python))], capture_output=True,
                       text=True, timeout=4000)
    if p.returncode == 77:
        return None, p.stderr.strip()
    if p.returncode != 0:
        sys.exit("horovod_bench: bench/horovod_venv.sh failed:\n" + p.stderr)
    return p.stdout.strip().splitlines()[-1], ""


def mpirun(ranks, env_names):
    argv = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    for name in env_names:
        argv += ["-x", name]
    return argv


def command(impl, transport, ranks, python, program):
    """argv and environment that start `program` (a list) as one job of `ranks`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if impl == "dtrain":
        env["PYTHONPATH"] = os.path.join(BUILD, "python")
        if transport == "gloo":
            return [DTRAIN, "launch", "-n", str(ranks), "-s", "0", "--no-summary", "--",
                    python, *program], env
        return mpirun(ranks, ["PYTHONPATH", "OMP_NUM_THREADS"]) + [python, *program], env
    # Horovod's venv sees Debian's torch, not dtrain's build; the example's own module beside it.
    env["PYTHONPATH"] = os.path.dirname(EXAMPLE)
    if transport == "gloo":
        horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
        return [horovodrun, "--gloo", "-np", str(ranks), "-H", "localhost:%d" % ranks,
                python, *program], env
    return mpirun(ranks, ["PYTHONPATH", "OMP_NUM_THREADS"]) + [python, *program], env


def run(argv, env):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
    if p.returncode != 0:
        sys.exit("horovod_bench: %s failed (%d):\n%s%s" % (" ".join(argv), p.returncode,
                                                          p.stdout[-3000:], p.stderr[-3000:]))
    return p.stdout


def mnist_program(impl, batches):
    script = EXAMPLE
    if impl == "horovod":
        text = open(EXAMPLE).read().replace("import dtrain.torch as hvd",
                                            "import horovod.torch as hvd")
        script = os.path.join(tempfile.gettempdir(), "horovod_mnist_real_horovod.py")
        with open(script, "w") as f:
            f.write(text)
    return [script, "--epochs", "1", "--log-interval", "100", "--max-batches", str(batches)]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="allreduce,resnet50,mnist")
    ap.add_argument("--transports", default="gloo,mpi")
    ap.add_argument("--sizes-kb", default="4,1024,4096,16384,65536")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--mnist-batches", type=int, default=0, help="0: the whole epoch")
    ap.add_argument("--horovod", choices=["yes", "built", "no"], default="yes",
                    help="yes: build Horovod's venv if needed; built: only if built already")
    args = ap.parse_args()
    hvd_python, why = horovod_python(args.horovod)
    impls = ["dtrain"] + (["horovod"] if hvd_python else [])
    if not hvd_python:
        print("horovod_bench: Horovod skipped: %s" % why, flush=True)
    pythons = {"dtrain": "/usr/bin/python3", "horovod": hvd_python}
    results = {}  # (case, transport, key, impl) -> [value]
    bounds = {}
    for i in range(args.repeat):
        for case in args.cases.split(","):
            for transport in args.transports.split(","):
                for impl in impls:
                    if case == "mnist":
                        program = mnist_program(impl, args.mnist_batches)
                    else:
                        program = [RANK, "--impl", impl, case, "--sizes-kb", args.sizes_kb,
                                   "--iterations", str(args.iterations),
                                   "--transport", transport]
                    argv, env = command(impl, transport, args.ranks, pythons[impl], program)
                    out = run(argv, env)
                    if case == "mnist":
                        speeds = SPEED.findall(out)
                        acc = re.search(r"Test_acc ([\d.]+)", out)
                        value = float(speeds[-1][1]) if speeds else 0.0
                        row = dict(case=case, impl=impl, transport=transport,
                                   samples_per_s=value, test_acc=acc[1] if acc else None)
                        print(json.dumps(row), flush=True)
                        results.setdefault((case, transport, "", impl), []).append(value)
                        continue
                    for line in out.splitlines():
                        line = line[line.find("{"):]
                        if not line.startswith("{"):
                            continue
                        row = json.loads(line)
                        print(json.dumps(row), flush=True)
                        key = str(row.get("kb", row.get("mb", "")))
                        results.setdefault((case, transport, key, impl), []).append(
                            row["median_ms"])
                        bounds.setdefault((case, key), []).append(2 * row["memcpy_ms"])
    print("\n| case | transport | size | dtrain | horovod | dtrain speedup | 2x memcpy |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (case, transport, key, impl), values in results.items():
        if impl != "dtrain":
            continue
        mine = statistics.median(values)
        theirs = results.get((case, transport, key, "horovod"))
        other = statistics.median(theirs) if theirs else None
        if case == "mnist":
            speedup = mine / other if other else None
            unit = "samples/s"
            bound = ""
        else:
            speedup = other / mine if other else None
            unit = "ms"
            bound = "%.3f ms" % statistics.median(bounds[(case, key)])
        size = {"allreduce": "%s KB" % key, "resnet50": "%s MB" % key, "mnist": "epoch"}[case]
        print("| %s | %s | %s | %.3f %s | %s | %s | %s |" % (
            case, transport, size, mine, unit, "%.3f" % other if other else "-",
            "%.2fx" % speedup if speedup else "-", bound))


if __name__ == "__main__":
    main()
