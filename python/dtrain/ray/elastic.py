"""Horovod's ``horovod.ray.ElasticRayExecutor`` on dtrain: an elastic allreduce job on a Ray
cluster, as many workers as its nodes hold (between a minimum and a maximum), that goes on when a
worker or a node is lost and grows when nodes join.

    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=8)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    results = executor.run(train)   # train: Horovod's elastic function (hvd.elastic.run)

How: ``run`` starts ``dtrain launch -s 0 --launcher ray --host-discovery-script 'python3 -m
dtrain.ray.discover' --min-np A --max-np B`` on this machine, dtrain's elastic driver
(src/launcher/watch/elastic_job.h). Its workers run on the Ray nodes the discovery lists, each
through a proxy here that has Ray run it on its node (dtrain/ray/_node_exec.py); ``train`` is
pickled to them (dtrain/_elastic_launch.py). Memberships, rollbacks to the last commit and new workers are
``dtrain.torch.elastic``'s, as under ``dtrain launch``. The results: each worker's that ended the
job, in its final rank order. Run this driver on a node of the cluster (the workers report to it).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Callable
from typing import Any

import ray
from ray import cloudpickle  # Ray vendors it

from .. import _elastic_launch
from .discover import slots


@dataclasses.dataclass
class ElasticSettings:
    """ElasticRayExecutor.create_settings's."""
    min_np: int = 1
    max_np: int | None = None
    elastic_timeout: int = 600
    timeout_s: int = 30
    verbose: int = 1


class ElasticRayExecutor:
    """See the module's docstring."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None, elastic_timeout: int = 600,
                        timeout_s: int = 30, ssh_identity_file: str | None = None,
                        nics: set[str] | None = None, min_np: int | None = None,
                        max_np: int | None = None, **kwargs: Any) -> ElasticSettings:
        """Horovod's: ``min_np``/``max_np`` (or ``min_num_proc``/``max_num_proc``) bound the number
        of workers (``max_np`` default: as many as the nodes hold); ``elastic_timeout``: how long
        the job may wait below ``min_np``. ``reset_limit`` is refused (dtrain's elastic jobs
        reset as often as workers change); the ssh and NIC arguments are accepted and unused."""
        if reset_limit is not None:
            raise ValueError("reset_limit is not supported: dtrain's elastic jobs form a new "
                             "membership whenever workers come or go")
        return ElasticSettings(min_np=min_np if min_np is not None else min_num_proc,
                               max_np=max_np if max_np is not None else max_num_proc,
                               elastic_timeout=elastic_timeout, timeout_s=timeout_s,
                               verbose=int(kwargs.get("verbose", 1)))

    def __init__(self, settings: ElasticSettings | None = None, use_gpu: bool = False,
                 cpus_per_slot: int = 1, gpus_per_slot: int | None = None,
                 env_vars: dict[str, str] | None = None, override_discovery: bool = True) -> None:
        if not override_discovery:
            raise ValueError("override_discovery=False: dtrain's elastic job on Ray always "
                             "discovers the cluster's live nodes (python3 -m dtrain.ray.discover)")
        self.settings = settings or ElasticSettings()
        if self.settings.min_np < 1:
            raise ValueError(f"min_np must be at least 1, got {self.settings.min_np}")
        if self.settings.max_np is not None and self.settings.max_np < self.settings.min_np:
            raise ValueError(f"max_np {self.settings.max_np} is below min_np "
                             f"{self.settings.min_np}")
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.env_vars = dict(env_vars or {})
        self._address: str | None = None

    def start(self) -> None:
        """Checks that this driver is connected to a Ray cluster (``ray.init`` first)."""
        if not ray.is_initialized():
            raise RuntimeError("ray.init() first: ElasticRayExecutor runs on the cluster this "
                               "driver is connected to")
        self._address = ray.get_runtime_context().gcs_address

    def _max_np(self) -> int:
        if self.settings.max_np is not None:
            return self.settings.max_np
        total = sum(slots(node, self.cpus_per_slot, self.gpus_per_slot)
                    for node in ray.nodes() if node["Alive"])  # as the discovery offers them
        return max(total, self.settings.min_np)

    def run(self, worker_fn: Callable[..., Any], callbacks: Any = None,
            args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Runs ``worker_fn(*args, **kwargs)`` as an elastic job; the results of the workers that
        ended it, in their final rank order. Raises, with the job's last output, when it fails
        (fewer than ``min_np`` workers for ``elastic_timeout``, or every worker lost)."""
        if self._address is None:
            raise RuntimeError("start() the ElasticRayExecutor first")
        python = sys.executable
        discover = (f"{shlex.quote(python)} -m dtrain.ray.discover --cpus-per-worker "
                    f"{self.cpus_per_slot} --gpus-per-worker {self.gpus_per_slot}")
        launch_args = ["--launcher", "ray", "--host-discovery-script", discover,
                       "--min-np", str(self.settings.min_np), "--max-np", str(self._max_np()),
                       "--elastic-timeout", str(self.settings.elastic_timeout)]
        env = dict(self.env_vars)
        env.update(RAY_ADDRESS=str(self._address), DTRAIN_RAY_CPUS=str(self.cpus_per_slot),
                   DTRAIN_RAY_GPUS=str(self.gpus_per_slot))
        return _elastic_launch.run_function(
            cloudpickle.dump, worker_fn, args, dict(kwargs or {}), launch_args, env,
            sys.stdout if self.settings.verbose else None, "on Ray")
