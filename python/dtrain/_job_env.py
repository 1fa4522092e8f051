"""The variables a dtrain process started by a cluster engine (a Ray actor, a Ray Train worker, a
Spark task) reads to find its job, as `dtrain launch` sets them for the processes it starts
(src/launcher/plan/job_plan.cc): no hostfile and no ssh, the job's secret handed to each process
by the engine's own call (never through a Ray runtime_env, which Ray shows on its dashboard)."""

import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Place:
    """Where a process of the job runs: its node (Ray's node id; for Spark, its host name), the
    address its peers reach it at, and its host name."""
    node_id: str
    address: str
    hostname: str


def here() -> Place:
    """This process's place (called inside a Ray actor)."""
    import ray

    return Place(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                 socket.gethostname())


def free_port() -> int:
    """A port nothing listens at on this node now (called inside the actor that will bind it;
    another process may take it before then, which the bind reports by name)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def new_secret() -> str:
    return secrets.token_hex(16)


def rank_order(places: Sequence[Place]) -> list[int]:
    """The actors' indexes in rank order: grouped by node (in the order each node first appears),
    so that one node's ranks are consecutive and share memory as local ranks."""
    first: dict[str, int] = {}
    for i, p in enumerate(places):
        first.setdefault(p.node_id, i)
    return sorted(range(len(places)), key=lambda i: (first[places[i].node_id], i))


def horovod_env(node_ids: Sequence[str], rank: int) -> dict[str, str]:
    """horovodrun's variables for worker `rank` (job_plan.cc's HorovodEnv): local = the ranks on
    its node, cross = the nodes that have a rank of its local rank."""
    node = node_ids[rank]
    local_rank = sum(1 for i in range(rank) if node_ids[i] == node)
    local_size = sum(1 for n in node_ids if n == node)
    per_node: dict[str, int] = {}
    for n in node_ids:
        per_node[n] = per_node.get(n, 0) + 1
    cross = [n for n, count in per_node.items() if count > local_rank]
    return {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(len(node_ids)),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(cross.index(node)), "HOROVOD_CROSS_SIZE": str(len(cross))}


def node_gpus(node_ids: Sequence[str], gpus: Sequence[Sequence[str]]) -> list[str]:
    """Each rank's CUDA_VISIBLE_DEVICES: the GPUs of every rank on its node, in rank order (the
    ranks are grouped by node), so local rank i's own GPUs come i-th."""
    per_node: dict[str, list[str]] = {}
    for node, ids in zip(node_ids, gpus):
        visible = per_node.setdefault(node, [])
        visible += [i for i in ids if i not in visible]
    return [",".join(per_node[node]) for node in node_ids]


def job_env(role: str, rank: int, num_workers: int, num_servers: int, root: tuple[str, int],
            address: str, secret: str) -> dict[str, str]:
    """What a node of the job reads: the scheduler (or, with no servers, rank 0's rendezvous) at
    `root`, the job's size and this node's own address."""
    env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": root[0], "DMLC_PS_ROOT_PORT": str(root[1]),
           "DMLC_NUM_SERVER": str(num_servers), "DMLC_NUM_WORKER": str(num_workers),
           "DMLC_NODE_HOST": address, "DTRAIN_JOB_SECRET": secret}
    if role != "scheduler":
        env["DTRAIN_NODE_RANK"] = str(rank)
    if num_servers == 0:
        env["DTRAIN_COLLECTIVES"] = "gloo"  # never an mpirun's variables that leaked into Ray
    return env


def apply(env: dict[str, str]) -> None:
    """Sets `env` in this process, first dropping the job variables it inherited (a Ray worker
    started from a shell inside another job must not join that one, nor run a server's role when
    it imports dtrain)."""
    for name in list(os.environ):
        if name.startswith(("DMLC_", "HOROVOD_")) or name in ("DTRAIN_NODE_RANK",
                                                               "DTRAIN_JOB_SECRET"):
            del os.environ[name]
    os.environ.update(env)


def worker_envs(places: Sequence[Place], num_servers: int, root: tuple[str, int], secret: str,
                extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Every worker's variables, in rank order (`places` is): the job's, horovodrun's, `extra`."""
    node_ids = [p.node_id for p in places]
    envs = []
    for rank, place in enumerate(places):
        env = job_env("worker", rank, len(places), num_servers, root, place.address, secret)
        env.update(horovod_env(node_ids, rank))
        env.update(extra or {})
        envs.append(env)
    return envs
