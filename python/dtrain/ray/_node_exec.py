"""`python3 -m dtrain.ray._node_exec --node ADDRESS -- ARGV...`: one worker of `dtrain launch
--launcher ray` (src/launcher/run/elastic_launcher.cc starts this proxy on the launcher's machine).

It asks Ray for an actor on the node at ADDRESS (hard node affinity) and runs ARGV there as a child
process, with the job's variables the launcher gave this proxy (DMLC_*, DTRAIN_*, HOROVOD_*, PS_*,
MXNET_*: the secret among them, handed over in the actor call, never on a command line). ARGV[0]
``@python`` is the node's Python (the actor's). The child's output comes back line by line and is
printed here, where the launcher merges it; this proxy exits with the child's code.

It stops the child (SIGTERM, then SIGKILL 5 s later) when the launcher closes its stdin or
signals it; if this proxy is killed outright, Ray ends the actors its
driver owned, and the child dies with its actor (PR_SET_PDEATHSIG). When Ray loses the actor or
its node, the proxy says so, naming the node, and exits 1.

Files: DTRAIN_RAY_FN (a file here) is copied to the node and the child is told its path there;
the file the child writes at DTRAIN_RAY_RESULT (a path on the node) comes back as
DTRAIN_RAY_RESULT_DIR/worker-N here, N the worker's number (dtrain.ray.elastic's functions and
results). DTRAIN_RAY_CPUS and DTRAIN_RAY_GPUS (default 1
and 0): the actor's resources.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

FORWARDED = ("DMLC_", "DTRAIN_", "HOROVOD_", "PS_", "MXNET_")
_STOP_GRACE_S = 5.0
_LOST = 1  # the exit code when Ray lost the actor or its node


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Runner:
    """The actor on the chosen node: runs one child and streams its output."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[str] | None = None
        self.folder = tempfile.mkdtemp(prefix="dtrain-ray-")

    def run(self, argv: list[str], env: dict[str, str],
            fn_bytes: bytes | None) -> Iterator[tuple[str, Any]]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(FORWARDED)}
        child_env = {**base, **env}
        if fn_bytes is not None:
            path = os.path.join(self.folder, "fn.pkl")
            with open(path, "wb") as f:
                f.write(fn_bytes)
            child_env["DTRAIN_RAY_FN"] = path
        result = os.path.join(self.folder, "result.pkl")
        child_env["DTRAIN_RAY_RESULT"] = result
        argv = [sys.executable if a == "@python" else a for a in argv]
        self.child = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      text=True, errors="replace", preexec_fn=_die_with_parent)
        assert self.child.stdout is not None
        for line in self.child.stdout:
            yield ("out", line)
        code = self.child.wait()
        if os.path.exists(result):
            with open(result, "rb") as f:
                yield ("result", f.read())
        yield ("exit", code)

    def stop(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()


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
    runner_class: Any = ray.remote(_Runner)
    runner = runner_class.options(
        num_cpus=args.cpus, num_gpus=args.gpus, max_concurrency=2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(_node_id(args.node), soft=False)
    ).remote()
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            try:
                ray.get(runner.stop.remote(), timeout=_STOP_GRACE_S + 5)
            except Exception:  # noqa: BLE001  (the actor is gone: so is the child)
                pass
            os._exit(128 + signal.SIGTERM)

    def stop_at_eof() -> None:
        sys.stdin.read()  # the launcher holds it open until the job ends
        stop()

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stop).start())
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=stop).start())
    threading.Thread(target=stop_at_eof, daemon=True).start()

    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    fn_path = env.pop("DTRAIN_RAY_FN", None)
    result_dir = env.pop("DTRAIN_RAY_RESULT_DIR", None)
    result_path = (os.path.join(result_dir, "worker-" + env.get("DTRAIN_NODE_RANK", "0"))
                   if result_dir else None)
    fn_bytes = None
    if fn_path:
        with open(fn_path, "rb") as f:
            fn_bytes = f.read()
    code = _LOST
    try:
        for ref in runner.run.options(num_returns="streaming").remote(argv, env, fn_bytes):
            kind, value = ray.get(ref)
            if kind == "out":
                sys.stdout.write(value)
                sys.stdout.flush()
            elif kind == "result" and result_path:
                with open(result_path, "wb") as out:
                    out.write(value)
            elif kind == "exit":
                code = int(value)
    except ray.exceptions.RayError as e:
        if stopping.is_set():
            return 128 + signal.SIGTERM
        print(f"dtrain.ray: the worker's actor on node {args.node} was lost: "
              f"{str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return _LOST
    return code


if __name__ == "__main__":
    sys.exit(main())
