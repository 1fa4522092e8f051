"""Horovod's ``horovod.spark.run_elastic`` on dtrain: the user's elastic function (``@hvd.elastic.
run``) on Spark tasks, as many as are running (between ``min_np`` and ``max_np``), going on when a
task is lost and growing again when Spark starts it anew.

How: one Spark job of ``max_np`` ordinary tasks (not a barrier stage: Spark may start them one by
one and retries a task that fails, up to spark.task.maxFailures). Each task runs an agent that
registers with a registry in this driver (dtrain/spark/_agents.py). Once ``min_np`` have,
``dtrain launch -s 0 --launcher spark`` runs here: dtrain's elastic driver, its discovery script
the registry's live tasks by address (dtrain/spark/discover.py), each worker run by a free task
through a proxy (dtrain/spark/_node_exec.py). Memberships, rollbacks to the last commit and new
workers are ``dtrain.torch.elastic``'s, as under ``dtrain launch``. When the job ends, the
registry closes and every task returns."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import _elastic_launch, _job_env
from . import _agents
from .runner import _START_TIMEOUT_S, _reason, _spark_context

_ELASTIC_TIMEOUT_S = 600  # Horovod's default (HOROVOD_ELASTIC_TIMEOUT)
_TASKS_END_S = 30.0


class _Tasks:
    """The Spark job of the agents, run in a thread of its own (Spark's job group is per
    thread)."""

    def __init__(self, sc: Any, count: int, run_agent: Callable[..., Any]) -> None:
        self.sc, self.group = sc, f"dtrain.spark-elastic-{uuid.uuid4().hex[:12]}"
        self.error: BaseException | None = None

        def job() -> None:
            try:
                sc.setJobGroup(self.group, "dtrain.spark.run_elastic", interruptOnCancel=True)
                sc.parallelize(range(count), count).mapPartitions(run_agent).collect()
            except BaseException as e:  # noqa: BLE001  (reported by the caller)
                self.error = e

        self.thread = threading.Thread(target=job, name=self.group, daemon=True)
        self.thread.start()

    def end(self) -> None:
        """After the registry closed: the tasks return; those Spark never started are cancelled."""
        self.thread.join(_TASKS_END_S)
        if self.thread.is_alive():
            self.sc.cancelJobGroup(self.group)
            self.thread.join(_TASKS_END_S)


def _driver_address(sc: Any) -> str:
    """Where the executors reach this driver, as Spark told them."""
    return socket.gethostbyname(sc.getConf().get("spark.driver.host", socket.gethostname()))


def run_elastic(fn: Callable[..., Any], args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None, num_proc: int | None = None,
                min_np: int | None = None, max_np: int | None = None,
                start_timeout: int | None = None, elastic_timeout: int | None = None,
                reset_limit: int | None = None, env: dict[str, str] | None = None,
                stdout: Any = None, stderr: Any = None, verbose: int = 1, nics: Any = None,
                prefix_output_with_timestamp: bool = False, min_num_proc: int | None = None,
                max_num_proc: int | None = None) -> list[Any]:
    """Runs ``fn(*args, **kwargs)``, an elastic function (``hvd.elastic.run``), on between
    ``min_np`` (default ``num_proc``) and ``max_np`` (default ``num_proc``, itself defaulting to
    the cluster's ``defaultParallelism``) Spark tasks; the results of the workers that ended the
    job, in their final rank order.

    ``start_timeout`` (default HOROVOD_SPARK_START_TIMEOUT or 600 s): how long Spark may take to
    start ``min_np`` tasks; ``elastic_timeout`` (default HOROVOD_ELASTIC_TIMEOUT or 600 s): how
    long the job may then wait below ``min_np``. ``env`` is set in every worker; the job's merged
    output goes to ``stdout`` (default: this process's, when ``verbose``); ``stderr`` is unused
    (the output is merged). ``reset_limit`` is refused (dtrain's elastic jobs form a new
    membership whenever workers change); the NIC and timestamp arguments are accepted and unused.
    Raises, with the job's last output, when it fails."""
    if reset_limit is not None:
        raise ValueError("reset_limit is not supported: dtrain's elastic jobs form a new "
                         "membership whenever workers come or go")
    sc = _spark_context()
    num_proc = num_proc or sc.defaultParallelism
    low = min_np or min_num_proc or num_proc
    high = max_np or max_num_proc or num_proc
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= min_np <= max_np, got min_np {low}, max_np {high}")
    if start_timeout is None:
        start_timeout = int(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", _START_TIMEOUT_S))
    if elastic_timeout is None:
        elastic_timeout = int(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", _ELASTIC_TIMEOUT_S))
    from pyspark import cloudpickle

    token = _job_env.new_secret()
    registry = _agents.Registry(token)
    address = (_driver_address(sc), registry.port)
    tasks = _Tasks(sc, high, _agents.agent_task(address, token, dict(env or {})))
    try:
        _wait_for_tasks(registry, tasks, low, high, start_timeout, sc, verbose)
        discover = f"{shlex.quote(sys.executable)} -m dtrain.spark.discover"
        launch_args = ["--launcher", "spark", "--host-discovery-script", discover,
                       "--min-np", str(low), "--max-np", str(high),
                       "--elastic-timeout", str(elastic_timeout)]
        spark_env = {"DTRAIN_SPARK_REGISTRY": f"{address[0]}:{address[1]}",
                     "DTRAIN_SPARK_TOKEN": token}
        out = stdout if stdout is not None else (sys.stdout if verbose else None)
        return _elastic_launch.run_function(cloudpickle.dump, fn, tuple(args),
                                            dict(kwargs or {}), launch_args, spark_env, out,
                                            "on Spark")
    finally:
        registry.close()
        tasks.end()


def _wait_for_tasks(registry: _agents.Registry, tasks: _Tasks, low: int, high: int,
                    start_timeout: int, sc: Any, verbose: int) -> None:
    if verbose:
        print(f"dtrain.spark: {high} tasks for an elastic job of {low} to {high} workers "
              f"(job group {tasks.group})", file=sys.stderr, flush=True)
    deadline = time.monotonic() + start_timeout
    while len(registry.agents()) < low:
        if tasks.error is not None:
            raise RuntimeError("dtrain.spark: the Spark job of the tasks failed: "
                               + _reason(tasks.error)) from tasks.error
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"dtrain.spark: Spark started {len(registry.agents())} of the {low} tasks needed "
                f"(min_np) within {start_timeout} s (start_timeout); the cluster has "
                f"{sc.defaultParallelism} task slots")
        time.sleep(0.2)
