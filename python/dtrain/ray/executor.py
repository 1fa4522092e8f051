"""Horovod's RayExecutor on dtrain: one Ray actor per rank runs the user's function, which calls
``import dtrain.torch as hvd; hvd.init()`` (allreduce over Gloo) or, with ``num_servers``,
``dtrain.kv.create('dist_sync')`` (the scheduler and servers are Ray actors too).

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=2)
    executor.start()
    losses = executor.run(train, args=[config])  # one result a rank, in rank order
    executor.shutdown()

GPUs (``use_gpu=True``, ``gpus_per_worker``): Ray gives each actor its own; as Horovod's RayExecutor
does, every rank sees all the GPUs Ray gave its node's ranks (CUDA_VISIBLE_DEVICES, in local rank
order), so that Horovod's ``torch.cuda.set_device(hvd.local_rank())`` picks a GPU of its own.

What Ray starts and how it reaches the job: the actors go into a placement group (PACK by
default, as Horovod's; ``placement_strategy="SPREAD"`` spreads them); ranks are grouped by node, so
a node's ranks are consecutive local ranks that share memory. Each actor is told the job's
address and secret by a method call (no ssh, no hostfile). A rank that fails makes ``run`` raise
at once, naming the rank and its node; the other ranks' dtrain fails them within seconds (a dead
peer), and ``shutdown`` ends every actor.

Restarts (``max_restarts=K``, parameter-server jobs, as ``dtrain launch --max-restarts``): the
scheduler keeps a lost worker's place (DTRAIN_RESTART_WAIT_MS), and ``run`` or ``execute`` replace a
worker whose actor died (its process, or its node) with a new actor in the same bundle that runs
the function again and rejoins the job. A function that raises is not rerun: that is raised. The
scheduler and servers are not replaced.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .. import _job_env
from .._job_env import Place


@dataclasses.dataclass
class MiniSettings:
    """RayExecutor.create_settings's: how long to wait for the actors' placement, and for each
    call of theirs that should be quick (their places, their start)."""
    timeout_s: int = 30
    placement_group_timeout_s: int = 100
    verbose: int = 1


class _Worker:
    """A rank's actor: holds the user's executable (``execute``) and runs their functions."""

    def __init__(self) -> None:
        self.executable: Any = None

    def place(self) -> Place:
        return _job_env.here()

    def free_port(self) -> int:
        return _job_env.free_port()

    def gpu_ids(self) -> list[str]:
        """The GPUs Ray gave this actor (its CUDA_VISIBLE_DEVICES as Ray set it)."""
        return [str(i) for i in ray.get_gpu_ids()]

    def set_env(self, env: dict[str, str]) -> None:
        _job_env.apply(env)

    def start_executable(self, cls: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.executable = cls(*args, **kwargs) if cls is not None else None

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.executable)

    def run(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        return fn(*args, **kwargs)

    def serve(self) -> int:
        """Runs this actor's role (scheduler or server, from its env) until the job ends."""
        from dtrain import _dtrain

        code = _dtrain.run_role_if_service()
        return 0 if code is None else int(code)


class RayExecutor:
    """Horovod's ``horovod.ray.RayExecutor``: see the module's docstring."""

    @staticmethod
    def create_settings(timeout_s: int = 30, ssh_identity_file: str | None = None,
                        ssh_str: str | None = None, placement_group_timeout_s: int = 100,
                        nics: set[str] | None = None) -> MiniSettings:
        """Horovod's settings; the ssh and NIC arguments are accepted and unused (Ray reaches the
        actors; each announces its node's address)."""
        return MiniSettings(timeout_s=timeout_s,
                            placement_group_timeout_s=placement_group_timeout_s)

    def __init__(self, settings: MiniSettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: int | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None,
                 num_servers: int = 0, cpus_per_server: int = 1,
                 placement_strategy: str = "PACK", max_restarts: int = 0) -> None:
        if min_workers is not None or max_workers is not None:
            raise NotImplementedError(
                "RayExecutor(min_workers=, max_workers=): use dtrain.ray.ElasticRayExecutor "
                "(Horovod's) for an elastic job on Ray")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False")
        if num_hosts is not None:
            if num_workers is not None:
                raise ValueError("give num_workers, or num_hosts and num_workers_per_host")
            num_workers = num_hosts * num_workers_per_host
        if num_workers is None or num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        if num_servers < 0:
            raise ValueError(f"num_servers must be 0 (allreduce) or more, got {num_servers}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be 0 or more, got {max_restarts}")
        if max_restarts and not num_servers:
            raise ValueError("max_restarts replaces workers of parameter-server jobs "
                             "(num_servers > 0); an allreduce job cannot take a new rank in the "
                             "middle of its collectives (as `dtrain launch --max-restarts`)")
        if placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"placement_strategy {placement_strategy!r}: PACK, SPREAD, "
                             "STRICT_PACK or STRICT_SPREAD")
        self.settings = settings or MiniSettings()
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.num_servers = num_servers
        self.cpus_per_server = cpus_per_server
        self.placement_strategy = placement_strategy
        self.max_restarts = max_restarts
        self.restarts = 0  # workers replaced so far
        self.workers: list[Any] = []  # actor handles, in rank order
        self.places: list[Place] = []  # theirs, in rank order
        self._services: list[tuple[str, Any, Any]] = []  # (name, actor, serve() ref)
        self._placement_group: Any = None
        self._worker_bundles: list[int] = []  # each rank's bundle, in rank order
        self._worker_envs: list[dict[str, str]] = []  # each rank's variables, in rank order
        self._executable: tuple[Any, list[Any], dict[str, Any]] = (None, [], {})

    # --- start ---

    def start(self, executable_cls: type | None = None,
              executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None,
              extra_env_vars: dict[str, str] | None = None) -> None:
        """Places and starts the actors, tells each its rank and the job, and makes
        ``executable_cls(*executable_args, **executable_kwargs)`` on each (for ``execute``)."""
        if self.workers:
            raise RuntimeError("this RayExecutor has started already (shutdown() first)")
        try:
            self._start(executable_cls, list(executable_args or []),
                        dict(executable_kwargs or {}), dict(extra_env_vars or {}))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, cls: type | None, args: list[Any], kwargs: dict[str, Any],
               extra_env: dict[str, str]) -> None:
        worker_bundle = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            worker_bundle["GPU"] = self.gpus_per_worker
        if self.num_hosts is not None:  # Horovod's ColocatedStrategy: one bundle a host
            per_host = {k: v * self.num_workers_per_host for k, v in worker_bundle.items()}
            bundles, strategy = [per_host] * self.num_hosts, "STRICT_SPREAD"
            worker_bundles = [i // self.num_workers_per_host for i in range(self.num_workers)]
        else:
            bundles, strategy = [worker_bundle] * self.num_workers, self.placement_strategy
            worker_bundles = list(range(self.num_workers))
        services = ["scheduler"] + [f"server {s}" for s in range(self.num_servers)] \
            if self.num_servers else []
        bundles = bundles + [{"CPU": self.cpus_per_server}] * len(services)
        self._placement_group = placement_group(bundles, strategy=strategy)
        try:
            ray.get(self._placement_group.ready(),
                    timeout=self.settings.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"Ray could not place {self.num_workers} worker(s) of {worker_bundle}"
                f"{' and %d service(s) of %d CPU' % (len(services), self.cpus_per_server) if services else ''}"
                f" ({strategy}) within {self.settings.placement_group_timeout_s} s; the cluster "
                f"has {ray.available_resources()} free") from None

        actor = self._actor
        made = [actor(b, self.cpus_per_worker, self.gpus_per_worker) for b in worker_bundles]
        places = self._get([w.place.remote() for w in made], "reporting their places")
        order = _job_env.rank_order(places)
        self.workers = [made[i] for i in order]
        self.places = [places[i] for i in order]
        self._worker_bundles = [worker_bundles[i] for i in order]
        secret = _job_env.new_secret()
        if self.max_restarts:  # the scheduler keeps a lost worker's place for its replacement
            extra_env = {"DTRAIN_RESTART_WAIT_MS": "60000", **extra_env}
        if services:
            first = len(bundles) - len(services)
            service_actors = [actor(first + i, self.cpus_per_server, 0)
                              for i in range(len(services))]
            scheduler = service_actors[0]
            service_places = self._get([a.place.remote() for a in service_actors],
                                       "placing the scheduler and servers")
            root = (service_places[0].address,
                    self._get([scheduler.free_port.remote()], "choosing a port")[0])
            restart_env = {k: v for k, v in extra_env.items() if k == "DTRAIN_RESTART_WAIT_MS"}
            envs = [_job_env.job_env("scheduler", 0, self.num_workers, self.num_servers, root,
                                     service_places[0].address, secret)]
            envs += [_job_env.job_env("server", s, self.num_workers, self.num_servers, root,
                                      service_places[s + 1].address, secret)
                     for s in range(self.num_servers)]
            envs = [{**e, **restart_env} for e in envs]
            self._get([a.set_env.remote(e) for a, e in zip(service_actors, envs)],
                      "telling the services the job")
            self._services = [(name, a, a.serve.remote())
                              for name, a in zip(services, service_actors)]
        else:  # allreduce: rank 0 holds the rendezvous
            root = (self.places[0].address,
                    self._get([self.workers[0].free_port.remote()], "choosing a port")[0])
        self._worker_envs = _job_env.worker_envs(self.places, self.num_servers, root, secret,
                                                 extra_env)
        if self.gpus_per_worker:
            gpus = self._get([w.gpu_ids.remote() for w in self.workers], "listing their GPUs")
            for env, visible in zip(self._worker_envs,
                                    _job_env.node_gpus([p.node_id for p in self.places], gpus)):
                env["CUDA_VISIBLE_DEVICES"] = visible
        self._get([w.set_env.remote(e) for w, e in zip(self.workers, self._worker_envs)],
                  "telling the workers the job")
        self._executable = (cls, args, kwargs)
        self._get([w.start_executable.remote(cls, args, kwargs) for w in self.workers],
                  "making the executable")

    def _actor(self, bundle: int, cpus: int, gpus: int) -> Any:
        return ray.remote(_Worker).options(
            num_cpus=cpus, num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._placement_group, placement_group_bundle_index=bundle)).remote()

    def _replace(self, rank: int) -> None:
        """A new actor for a lost worker's rank, in its bundle (which Ray places again if its node
        is gone), told the job as a replacement (DTRAIN_RESTART_COUNT, as `dtrain launch
        --max-restarts` tells one): it rejoins the running job where its rank was."""
        self.restarts += 1
        try:
            ray.kill(self.workers[rank])
        except Exception:  # noqa: BLE001  (already gone)
            pass
        actor = self._actor(self._worker_bundles[rank], self.cpus_per_worker,
                            self.gpus_per_worker)
        self.workers[rank] = actor  # shutdown() ends it whatever happens next
        try:
            place = ray.get(actor.place.remote(),
                            timeout=self.settings.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"Ray could not place a replacement for rank {rank} within "
                               f"{self.settings.placement_group_timeout_s} s") from None
        env = dict(self._worker_envs[rank], DMLC_NODE_HOST=place.address,
                   DTRAIN_RESTART_COUNT=str(self.restarts))
        self.places[rank] = place
        self._get([actor.set_env.remote(env)], f"telling rank {rank}'s replacement the job")
        self._get([actor.start_executable.remote(*self._executable)],
                  f"making rank {rank}'s replacement's executable")

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """Quick calls of the actors: at most settings.timeout_s."""
        try:
            return ray.get(refs, timeout=self.settings.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the actors did not finish {what} within "
                               f"{self.settings.timeout_s} s (create_settings(timeout_s))") from None

    # --- calls ---

    def execute(self, fn: Callable[[Any], Any], callbacks: Any = None) -> list[Any]:
        """``fn(executable)`` on every rank; the results in rank order."""
        self._check_started()
        return self._gather(lambda w: w.execute.remote(fn))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        self._check_started()
        return self._gather(lambda w: w.execute.remote(fn), ranks=[0])[0]

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
            kwargs: dict[str, Any] | None = None, callbacks: Any = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order. Raises at the first
        rank (or service) that fails, naming it and its node; with ``max_restarts``, a worker
        whose actor died (its process or its node) is replaced and runs ``fn`` again, rejoining
        the job (``dtrain.kv``'s ``rejoined`` and ``rounds_done`` tell it where)."""
        self._check_started()
        call_args, call_kwargs = list(args or []), dict(kwargs or {})
        return self._gather(lambda w: w.run.remote(fn, call_args, call_kwargs))

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        """As ``run``, but returns the ranks' object refs at once (``ray.get`` them; nothing
        replaces a worker lost then)."""
        self._check_started()
        return [w.run.remote(fn, list(args or []), dict(kwargs or {})) for w in self.workers]

    def _check_started(self) -> None:
        if not self.workers:
            raise RuntimeError("start() the RayExecutor first")

    def _gather(self, call: Callable[[Any], Any], ranks: list[int] | None = None) -> list[Any]:
        """``call(actor)`` on each of ``ranks`` (default every one); their results in that order.
        Waited for as they end, with the services' runs beside them: the first failure is raised
        at once, not after the ranks before it (which may wait for the failed one)."""
        ranks = list(range(len(self.workers))) if ranks is None else ranks
        rank_of = {call(self.workers[r]): r for r in ranks}
        services = {ref: name for name, _, ref in self._services}
        results: dict[int, Any] = {}
        pending = list(rank_of) + list(services)
        while any(ref in rank_of for ref in pending):
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            if ref in services:
                self._service_ended(ref, services.pop(ref))
                continue  # the job ended: every worker has finished its part
            rank = rank_of.pop(ref)
            try:
                results[rank] = ray.get(ref)
            except ray.exceptions.RayActorError as e:  # its process or node is gone
                if self.restarts >= self.max_restarts:
                    raise self._failed(rank, e) from e
                place = self.places[rank]
                self._replace(rank)
                print(f"dtrain.ray: rank {rank} on node {place.address} ({place.hostname}) was "
                      f"lost; replaced ({self.restarts} of {self.max_restarts} restarts) on "
                      f"{self.places[rank].address}", file=sys.stderr, flush=True)
                again = call(self.workers[rank])
                rank_of[again] = rank
                pending.append(again)
            except ray.exceptions.RayError as e:
                raise self._failed(rank, e) from e
        return [results[r] for r in ranks]

    def _failed(self, rank: int, error: Exception) -> RuntimeError:
        place = self.places[rank]
        return RuntimeError(f"rank {rank} on node {place.address} ({place.hostname}) failed: "
                            f"{error}")

    def _service_ended(self, ref: Any, name: str) -> None:
        self._services = [s for s in self._services if s[2] is not ref]
        try:
            code = ray.get(ref)
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"the job's {name} failed: {e}") from e
        if code != 0:
            raise RuntimeError(f"the job's {name} exited with code {code}")

    # --- end ---

    def shutdown(self) -> None:
        """Ends every actor (and the placement group this executor made)."""
        for actor in self.workers + [a for _, a, _ in self._services]:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001  (already gone)
                pass
        self.workers, self.places, self._services = [], [], []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None
