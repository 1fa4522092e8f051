"""A Ray Train backend: the slot Ray's HorovodTrainer left (ray-project/ray#49454), for scripts
written to Horovod's API or MXNet's kvstore.

    from ray.train import ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    import dtrain.ray

    def train_fn(config):
        import dtrain.torch as hvd
        hvd.init()                      # or dtrain.kv.create("dist_sync") with num_servers
        ...
        ray.train.report({"loss": loss}, checkpoint=...)

    DataParallelTrainer(train_fn, backend_config=dtrain.ray.Config(),
                        scaling_config=ScalingConfig(num_workers=4)).fit()

Ray Train's worker group runs train_fn; before it starts, this backend tells each worker its rank,
the job's rendezvous (rank 0's, or with ``num_servers`` a scheduler's) and a fresh secret, as
RayExecutor does. With ``num_servers`` the scheduler and servers are Ray actors of their own for
the length of the run. Ray Train's restarts (``FailureConfig(max_failures=...)``) start a new group
and call ``on_start`` again: a new job, resumed from the checkpoint train_fn reported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray
from ray.train.backend import Backend, BackendConfig

from .. import _job_env
from .executor import _Worker


@dataclasses.dataclass
class Config(BackendConfig):
    """dtrain's Ray Train backend: ``num_servers`` 0 for allreduce (Horovod's API), or the
    parameter servers of a dist kvstore; each with ``cpus_per_server`` CPUs."""
    num_servers: int = 0
    cpus_per_server: int = 1
    timeout_s: int = 60

    @property
    def backend_cls(self) -> type[Backend]:
        return _DtrainBackend


def _shutdown_collectives() -> None:
    import dtrain.torch as hvd

    if hvd.is_initialized():
        hvd.shutdown()


class _DtrainBackend(Backend):
    # As Ray's torch backend: each worker sees its node's workers' GPUs (local rank i the i-th).
    share_cuda_visible_devices = True
    # Ray makes Backend a singleton: a run's services are kept by the worker group they serve.
    _services: dict[int, list[Any]] = {}

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, Config)
        places = worker_group.execute(_job_env.here)  # in rank order (Ray sorts them by node)
        secret = _job_env.new_secret()
        workers = len(places)
        servers = backend_config.num_servers
        if servers:
            actor_class: Any = ray.remote(_Worker)
            actors: list[Any] = [
                actor_class.options(num_cpus=backend_config.cpus_per_server).remote()
                for _ in range(servers + 1)]
            self._services[id(worker_group)] = actors
            service_places = ray.get([a.place.remote() for a in actors],
                                     timeout=backend_config.timeout_s)
            port: int = ray.get(actors[0].free_port.remote(), timeout=backend_config.timeout_s)
            root = (service_places[0].address, port)
            roles = [("scheduler", 0)] + [("server", s) for s in range(servers)]
            ray.get([a.set_env.remote(_job_env.job_env(role, rank, workers, servers, root,
                                                       place.address, secret))
                     for a, (role, rank), place in zip(actors, roles, service_places)],
                    timeout=backend_config.timeout_s)
            for a in actors:
                a.serve.remote()  # until the job ends (every worker finished) or on_shutdown
        else:
            root = (places[0].address, worker_group.execute_single(0, _job_env.free_port))
        for rank, env in enumerate(_job_env.worker_envs(places, servers, root, secret)):
            worker_group.execute_single(rank, _job_env.apply, env)

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, Config)
        try:
            # Each worker's own: a worker that died has nothing left to shut down (its call
            # errs), and the others' must not wait on it.
            calls = worker_group.execute_async(_shutdown_collectives)
            ray.wait(calls, num_returns=len(calls), timeout=backend_config.timeout_s)
        finally:
            for actor in self._services.pop(id(worker_group), []):
                ray.kill(actor)
