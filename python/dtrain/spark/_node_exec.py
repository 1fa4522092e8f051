"""`python3 -m dtrain.spark._node_exec --node ADDRESS -- ARGV...`: one worker of `dtrain launch
--launcher spark`, which dtrain.spark.run_elastic starts (src/launcher/run/elastic_launcher.cc
starts this proxy on the driver's machine).

It asks a free task of the job on ADDRESS (one of the registry's agents, dtrain/spark/_agents.py)
to run ARGV as a child process, with the job's variables and files as dtrain/_engine_child.py
says. The child's output comes back line by line and is printed here, where the launcher merges
it; this proxy exits with the child's code. It stops the child when the launcher closes its stdin
or signals it; if this proxy dies, the task sees its connection close and stops the child. When
the task is lost (its process or its executor died), the proxy says so, naming it, and exits 1.
DTRAIN_SPARK_REGISTRY and DTRAIN_SPARK_TOKEN: where the registry is, and the job's token.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
from typing import Any

from .. import _engine_child
from . import _agents, _wire


def _claim(address: str, argv: list[str], job: _engine_child.ProxyJob) -> tuple[socket.socket,
                                                                               dict[str, Any]]:
    registry, token = _agents.registry_from_env()
    here = [a for a in _agents.list_agents(registry, token) if a.get("address") == address]
    for agent in here:
        try:
            sock = _wire.join((agent["address"], int(agent["port"])), token,
                              {"role": "run", "argv": argv, "env": job.env,
                               "fn": job.fn_bytes is not None})
        except (OSError, _wire.WireError):
            continue  # gone since the list was made
        try:
            if job.fn_bytes is not None:
                _wire.send(sock, b"f", job.fn_bytes)
            sock.settimeout(_wire.AUTH_TIMEOUT_S)
            if _wire.recv_json(sock, b"j").get("accepted"):
                sock.settimeout(None)
                return sock, agent
        except (OSError, _wire.WireError):
            pass
        sock.close()  # busy with another worker
    raise SystemExit(f"dtrain.spark: no free task of the job on {address} "
                     f"({len(here)} there, all busy or gone)")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python3 -m dtrain.spark._node_exec")
    ap.add_argument("--node", required=True, help="the tasks' address")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        ap.error("no command after --")
    job = _engine_child.ProxyJob()
    for name in ("DTRAIN_SPARK_REGISTRY", "DTRAIN_SPARK_TOKEN"):  # the driver's, not the job's
        job.env.pop(name, None)
    sock, agent = _claim(args.node, argv, job)
    stopping = _engine_child.stop_on_eof_or_signal(lambda: _wire.send(sock, b"s", b""))
    try:
        while True:
            kind, payload = _wire.recv(sock, limit=_wire.DATA_LIMIT)
            if kind == b"o":
                job.take("out", payload.decode(errors="replace"))
            elif kind == b"r":
                job.take("result", payload)
            elif kind == b"x":
                return int(json.loads(payload)["code"])
    except (OSError, _wire.WireError) as e:
        if stopping.is_set():
            return 128 + signal.SIGTERM
        print(f"dtrain.spark: the worker's {_agents.describe(agent)} was lost ({e})",
              file=sys.stderr, flush=True)
        return _engine_child.LOST


if __name__ == "__main__":
    sys.exit(main())
