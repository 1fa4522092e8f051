"""What the proxies of `dtrain launch --launcher ray|spark` share (dtrain/ray/_node_exec.py,
dtrain/spark/_node_exec.py): the proxy runs on the launcher's machine and has an engine (a Ray
actor, a Spark task) run one worker on a node as a child process of a ChildRunner there.

The proxy's inputs: the job's variables (FORWARDED prefixes; the secret among them, handed over
by the engine, never on a command line); DTRAIN_FN_FILE, a file here that is copied to the node
(the child is told its path there as DTRAIN_FN); DTRAIN_RESULT_DIR, where the file the child
writes at DTRAIN_RESULT comes back, as worker-N (N the worker's number). ARGV[0] ``@python`` is
the node's Python."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

FORWARDED = ("DMLC_", "DTRAIN_", "HOROVOD_", "PS_", "MXNET_")
STOP_GRACE_S = 5.0
LOST = 1  # a proxy's exit code when the engine lost the worker's node


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ChildRunner:
    """On the node: runs one child at a time and yields its output, its result and its code."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[str] | None = None
        self.folder = tempfile.mkdtemp(prefix="dtrain-node-")

    def run(self, argv: list[str], env: dict[str, str],
            fn_bytes: bytes | None) -> Iterator[tuple[str, Any]]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(FORWARDED)}
        child_env = {**base, **env}
        if fn_bytes is not None:
            path = os.path.join(self.folder, "fn.pkl")
            with open(path, "wb") as f:
                f.write(fn_bytes)
            child_env["DTRAIN_FN"] = path
        result = os.path.join(self.folder, "result.pkl")
        if os.path.exists(result):
            os.remove(result)  # a previous child's
        child_env["DTRAIN_RESULT"] = result
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
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()


class ProxyJob:
    """The proxy's side: what to send to the node, and where its result goes."""

    def __init__(self) -> None:
        self.env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
        fn_path = self.env.pop("DTRAIN_FN_FILE", None)
        result_dir = self.env.pop("DTRAIN_RESULT_DIR", None)
        self.result_path = (os.path.join(result_dir, "worker-" + self.env.get("DTRAIN_NODE_RANK",
                                                                              "0"))
                            if result_dir else None)
        self.fn_bytes = None
        if fn_path:
            with open(fn_path, "rb") as f:
                self.fn_bytes = f.read()

    def take(self, kind: str, value: Any) -> int | None:
        """One of ChildRunner.run's records: prints output, keeps the result; the exit code."""
        if kind == "out":
            sys.stdout.write(value)
            sys.stdout.flush()
        elif kind == "result" and self.result_path:
            with open(self.result_path, "wb") as out:
                out.write(value)
        elif kind == "exit":
            return int(value)
        return None


def stop_on_eof_or_signal(stop_child: Callable[[], None]) -> threading.Event:
    """Stops the child (``stop_child``), then exits 128+SIGTERM, when the launcher closes this
    proxy's stdin (it holds it open until the job ends) or signals it. The event is set once
    stopping has begun, so that the proxy can tell a stop from a lost node."""
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            try:
                stop_child()
            except Exception:  # noqa: BLE001  (the node is gone: so is the child)
                pass
            os._exit(128 + signal.SIGTERM)

    def stop_at_eof() -> None:
        sys.stdin.read()
        stop()

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stop).start())
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=stop).start())
    threading.Thread(target=stop_at_eof, daemon=True).start()
    return stopping
