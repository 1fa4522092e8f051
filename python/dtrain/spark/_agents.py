"""dtrain.spark.run_elastic's moving parts. The driver keeps a Registry; each Spark task of the
job runs an agent that registers there and then runs, one at a time, the workers that dtrain's
elastic launcher sends it through proxies (dtrain/spark/_node_exec.py). The discovery script
(dtrain/spark/discover.py) lists the live agents by address.

An agent is registered while its connection to the registry is open: a task that dies drops out
of the list, one that Spark starts again comes in. A task that Spark starts where one was just
lost is listed only once the loss has been visible for LOSS_SHOWN_S: dtrain's elastic driver
retires the slot of a worker that failed until its host's count of slots changes, and it must see
the count drop to know that the slot is fresh. When the driver closes the registry, every
agent stops its worker and its task ends. Every connection is authenticated first (_wire.py)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import _engine_child
from . import _wire

_ACCEPT_POLL_S = 0.5
LOSS_SHOWN_S = 5.0  # the discovery script runs every second (a Python start, pyspark imported)


def _log(message: str) -> None:
    print(f"dtrain.spark: {message}", file=sys.stderr, flush=True)


class Registry:
    """On the driver: the live agents, by the connection each holds open."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._server = socket.create_server(("", 0))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._agents: dict[int, dict[str, Any]] = {}
        self._connections: dict[int, socket.socket] = {}
        self._since: dict[int, float] = {}  # when each agent registered
        self._lost_at: dict[str, float] = {}  # the last loss of a task, by address
        self._next = 0
        self._closed = False
        threading.Thread(target=self._accept, name="dtrain.spark registry", daemon=True).start()

    def agents(self) -> list[dict[str, Any]]:
        """The live agents, those that came where a task was just lost held back (see above)."""
        now = time.monotonic()
        with self._lock:
            return [a for key, a in self._agents.items()
                    if not self._held_back(a["address"], self._since[key], now)]

    def _held_back(self, address: str, since: float, now: float) -> bool:
        lost_at = self._lost_at.get(address)
        return lost_at is not None and since >= lost_at and now < lost_at + LOSS_SHOWN_S

    def close(self) -> None:
        """Ends every agent's task: each sees its connection close."""
        with self._lock:
            self._closed = True
            connections = list(self._connections.values())
        self._server.close()
        for c in connections:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True).start()

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        try:
            hello = _wire.accept_member(sock, self.token)
        except (OSError, _wire.WireError) as e:
            _log(f"dropped a connection from {peer[0]}:{peer[1]} that is not the job's ({e})")
            sock.close()
            return
        try:
            if hello.get("role") == "list":
                _wire.send_json(sock, b"l", {"agents": self.agents()})
            elif hello.get("role") == "agent":
                self._hold(sock, hello)
        except (OSError, _wire.WireError):
            pass
        finally:
            sock.close()

    def _hold(self, sock: socket.socket, hello: dict[str, Any]) -> None:
        agent = {k: hello.get(k) for k in ("host", "address", "port", "task", "attempt")}
        with self._lock:
            if self._closed:
                return
            key, self._next = self._next, self._next + 1
            self._agents[key], self._connections[key] = agent, sock
            self._since[key] = time.monotonic()
        try:
            while sock.recv(1024):  # an agent sends nothing more: EOF when its task ends
                pass
        finally:
            with self._lock:
                self._agents.pop(key, None)
                self._connections.pop(key, None)
                self._since.pop(key, None)
                if not self._closed:
                    self._lost_at[str(agent["address"])] = time.monotonic()


def list_agents(registry: tuple[str, int], token: str) -> list[dict[str, Any]]:
    sock = _wire.join(registry, token, {"role": "list"})
    with sock:
        sock.settimeout(_wire.AUTH_TIMEOUT_S)
        return list(_wire.recv_json(sock, b"l")["agents"])


def registry_from_env() -> tuple[tuple[str, int], str]:
    """The registry's address and the job's token, as run_elastic hands them to its launcher."""
    host, _, port = os.environ["DTRAIN_SPARK_REGISTRY"].rpartition(":")
    return (host, int(port)), os.environ["DTRAIN_SPARK_TOKEN"]


def _address_toward(host: str) -> str:
    """This machine's address on the route to ``host``: where the launcher reaches this task."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP: picks the route, sends nothing
        return str(s.getsockname()[0])


class _Agent:
    """In one Spark task: serves the proxies' requests to run a worker, one at a time."""

    def __init__(self, token: str, user_env: dict[str, str]) -> None:
        self.token, self.user_env = token, user_env
        self.runner = _engine_child.ChildRunner()
        self.busy = threading.Lock()
        self.stopped = threading.Event()
        self.workers = 0

    def serve(self, listener: socket.socket) -> None:
        listener.settimeout(_ACCEPT_POLL_S)
        while not self.stopped.is_set():
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve_proxy, args=(sock, peer), daemon=True).start()
        self.runner.stop()
        with self.busy:  # the worker's end reported, if it had one
            pass

    def _serve_proxy(self, sock: socket.socket, peer: Any) -> None:
        with sock:
            try:
                request = _wire.accept_member(sock, self.token)
                fn_bytes = None
                if request.get("fn"):
                    sock.settimeout(_wire.AUTH_TIMEOUT_S * 12)
                    kind, fn_bytes = _wire.recv(sock, limit=_wire.DATA_LIMIT)
                    sock.settimeout(None)
            except (OSError, _wire.WireError) as e:
                _log(f"dropped a connection from {peer[0]}:{peer[1]} that is not the job's ({e})")
                return
            if self.stopped.is_set() or not self.busy.acquire(blocking=False):
                _wire.send_json(sock, b"j", {"accepted": False})
                return
            try:
                self.workers += 1
                _wire.send_json(sock, b"j", {"accepted": True})
                self._run(sock, list(map(str, request["argv"])),
                          {**self.user_env, **{str(k): str(v) for k, v in
                                               request["env"].items()}}, fn_bytes)
            except (OSError, _wire.WireError, KeyError, AttributeError) as e:
                _log(f"a worker's proxy at {peer[0]}:{peer[1]} went away ({e})")
                self.runner.stop()
            finally:
                self.busy.release()

    def _run(self, sock: socket.socket, argv: list[str], env: dict[str, str],
             fn_bytes: bytes | None) -> None:
        def stop_when_asked() -> None:
            try:
                while _wire.recv(sock)[0] != b"s":
                    pass
            except (OSError, _wire.WireError):
                pass  # the proxy is gone: so is the launcher's interest in this worker
            self.runner.stop()

        threading.Thread(target=stop_when_asked, daemon=True).start()
        for kind, value in self.runner.run(argv, env, fn_bytes):
            if kind == "out":
                _wire.send(sock, b"o", value.encode())
            elif kind == "result":
                _wire.send(sock, b"r", value)
            else:
                _wire.send_json(sock, b"x", {"code": value})


def agent_task(registry: tuple[str, int], token: str,
               user_env: dict[str, str]) -> Callable[[Iterator[Any]], Iterator[dict[str, Any]]]:
    """The Spark job's function: each task registers an agent and serves until the driver closes
    the registry."""

    def run_agent(_: Iterator[Any]) -> Iterator[dict[str, Any]]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        agent = _Agent(token, user_env)
        with socket.create_server(("", 0)) as listener:
            hello = {"role": "agent", "host": socket.gethostname(),
                     "address": _address_toward(registry[0]),
                     "port": listener.getsockname()[1],
                     "task": ctx.partitionId() if ctx else -1,
                     "attempt": ctx.attemptNumber() if ctx else 0}
            link = _wire.join(registry, token, hello)

            def watch_registry() -> None:
                try:
                    while link.recv(1024):
                        pass
                except OSError:
                    pass
                agent.stopped.set()

            threading.Thread(target=watch_registry, daemon=True).start()
            try:
                agent.serve(listener)
            finally:
                link.close()
        yield {"task": hello["task"], "attempt": hello["attempt"], "workers": agent.workers}

    return run_agent


def describe(agent: dict[str, Any]) -> str:
    return (f"Spark task {agent.get('task')} (attempt {agent.get('attempt')}) on "
            f"{agent.get('host')} ({agent.get('address')}:{agent.get('port')})")

