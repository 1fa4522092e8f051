"""Horovod's ``horovod.spark.run`` on dtrain: the user's function on one Spark task per rank.

    from pyspark.sql import SparkSession
    import dtrain.spark

    def train(lr):
        import dtrain.torch as hvd
        hvd.init()
        ...
        return loss

    SparkSession.builder.getOrCreate()
    losses = dtrain.spark.run(train, args=(0.01,), num_proc=4)  # one result a rank, in rank order

How the tasks meet: a barrier stage (Spark starts its tasks together or not at all), whose tasks
tell each other their host and a free port through ``BarrierTaskContext.allGather``, as PySpark's
own TorchDistributor does; no service of ours on the driver. Ranks are grouped by host, so a
host's tasks are consecutive local ranks that share memory. The job's secret travels in the
task's closure.

Failures: a rank whose function raises returns its error instead of failing its task, so Spark
fails the stage with its error only; the others fail within seconds on dtrain's side (a peer left) and ``run`` raises naming the
rank that failed first. A task whose process dies fails the stage, which Spark does not retry (a
barrier result stage cannot be), and ``run`` raises with Spark's reason. Spark reuses its Python workers between jobs: each task puts the process's environment back
and shuts dtrain's collectives down when ``fn`` returns.
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .. import _job_env

_START_TIMEOUT_S = 600  # Horovod's default (HOROVOD_SPARK_START_TIMEOUT)


class _Tee(io.TextIOBase):
    """Writes to the task's own stream (the executor's log) and keeps a copy for the driver."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.stream.write(text)
        return self.copy.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _host_of(executor_address: str) -> str:
    return executor_address.rsplit(":", 1)[0].strip("[]")


def _address_of(task: int, executor_addresses: Sequence[str]) -> str:
    """The IP peers reach this task at: its executor's, as Spark's scheduler knows it. A name
    that resolves to loopback here (Debian maps a host's own name to 127.0.1.1) is replaced, when
    other tasks run on other hosts, by this host's address on the route toward one of them."""
    mine = socket.gethostbyname(_host_of(executor_addresses[task]))
    if not mine.startswith("127."):
        return mine
    for other in executor_addresses:
        peer = socket.gethostbyname(_host_of(other))
        if not peer.startswith("127."):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 9))  # UDP: picks the route, sends nothing
                return str(s.getsockname()[0])
    return mine  # every task on this host


def _shutdown_collectives() -> None:
    if "dtrain.torch" in sys.modules:
        import dtrain.torch as hvd

        if hvd.is_initialized():
            hvd.shutdown()


def _task(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], secret: str,
          env: dict[str, str], capture: bool) -> Callable[[Any], Any]:
    """The barrier stage's function: one call a task, yielding one record for the driver."""

    def run_rank(_: Any) -> Any:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        task = ctx.partitionId()
        executors = [info.address for info in ctx.getTaskInfos()]
        me = {"host": socket.gethostname(), "address": _address_of(task, executors),
              "port": _job_env.free_port()}
        everyone = [json.loads(m) for m in ctx.allGather(json.dumps(me))]  # in task order
        places = [_job_env.Place(p["host"], p["address"], p["host"]) for p in everyone]
        order = _job_env.rank_order(places)
        rank = order.index(task)
        root = (everyone[order[0]]["address"], everyone[order[0]]["port"])
        envs = _job_env.worker_envs([places[i] for i in order], 0, root, secret, env)
        saved_env = dict(os.environ)
        saved_streams = sys.stdout, sys.stderr
        tees = (_Tee(sys.stdout), _Tee(sys.stderr)) if capture else None
        if tees:
            sys.stdout, sys.stderr = tees
        record: dict[str, Any] = {"task": task, "rank": rank, "host": me["host"],
                                  "address": me["address"]}
        try:
            _job_env.apply(envs[rank])
            record["result"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001  (returned: see the module's docstring)
            record["error"] = f"{type(e).__name__}: {e}"
            record["traceback"] = traceback.format_exc()
            record["failed_at"] = time.time()
        finally:
            try:
                _shutdown_collectives()
            finally:
                os.environ.clear()
                os.environ.update(saved_env)
                if tees:
                    record["stdout"], record["stderr"] = (t.copy.getvalue() for t in tees)
                sys.stdout, sys.stderr = saved_streams
        yield record

    return run_rank


def _spark_context() -> Any:
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("dtrain.spark.run needs a running Spark: create a SparkSession first "
                           "(SparkSession.builder.getOrCreate())")
    return sc


def _log(verbose: int, message: str) -> None:
    if verbose:
        print(f"dtrain.spark: {message}", file=sys.stderr, flush=True)


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
        num_proc: int | None = None, start_timeout: int | None = None,
        use_mpi: bool | None = None, use_gloo: bool | None = None,
        extra_mpi_args: str | None = None, env: dict[str, str] | None = None,
        stdout: Any = None, stderr: Any = None, verbose: int = 1, nics: Any = None,
        prefix_output_with_timestamp: bool = False, executable: str | None = None) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` Spark tasks (default: the cluster's
    ``defaultParallelism``), each a rank of one dtrain job (allreduce over Gloo: ``import
    dtrain.torch as hvd; hvd.init()`` inside ``fn``), and returns their results in rank order.

    ``env`` is set in every task. ``stdout``/``stderr``: where the ranks' Python output goes once
    they end, each line prefixed with its rank as horovodrun does (it always goes to the
    executors' logs too). ``start_timeout`` (default HOROVOD_SPARK_START_TIMEOUT or 600 s): how
    long Spark may take to start all the tasks at once. The MPI and NIC arguments are Horovod's,
    refused or unused: dtrain's allreduce here is Gloo's and each task announces its address."""
    if use_mpi:
        raise ValueError("dtrain.spark runs Gloo's allreduce; use_mpi=True is not supported")
    if extra_mpi_args:
        raise ValueError("extra_mpi_args: dtrain.spark does not start MPI")
    sc = _spark_context()
    num_proc = num_proc or sc.defaultParallelism
    if num_proc < 1:
        raise ValueError(f"num_proc must be at least 1, got {num_proc}")
    if start_timeout is None:
        start_timeout = int(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", _START_TIMEOUT_S))
    capture = stdout is not None or stderr is not None
    task = _task(fn, list(args), dict(kwargs or {}), _job_env.new_secret(), dict(env or {}),
                 capture)
    group = f"dtrain.spark-{uuid.uuid4().hex[:12]}"
    _log(verbose, f"{num_proc} tasks in a barrier stage (job group {group})")
    records = _collect(sc, task, num_proc, group, start_timeout)
    return _results(records, num_proc, stdout, stderr, prefix_output_with_timestamp)


def _collect(sc: Any, task: Callable[[Any], Any], num_proc: int, group: str,
             start_timeout: int) -> list[dict[str, Any]]:
    """Runs the barrier stage in a thread of its own (Spark's job group is per thread) while this
    one watches that its tasks start within ``start_timeout``."""
    outcome: dict[str, Any] = {}

    def job() -> None:
        try:
            sc.setJobGroup(group, "dtrain.spark.run", interruptOnCancel=True)
            rdd = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task)
            outcome["records"] = rdd.collect()
        except BaseException as e:  # noqa: BLE001  (raised in the caller's thread)
            outcome["error"] = e

    thread = threading.Thread(target=job, name=group, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while thread.is_alive():
        thread.join(0.5)
        if thread.is_alive() and time.monotonic() > deadline and not _started(sc, group):
            sc.cancelJobGroup(group)
            thread.join(60)
            raise TimeoutError(
                f"dtrain.spark: Spark did not start the {num_proc} tasks within {start_timeout} s "
                f"(start_timeout): a barrier stage needs {num_proc} free task slots at once, and "
                f"the cluster has {sc.defaultParallelism}")
    if "error" in outcome:
        raise RuntimeError("dtrain.spark: the Spark job failed (a task's process died?): "
                           + _reason(outcome["error"])) from outcome["error"]
    return outcome["records"]


def _reason(error: BaseException) -> str:
    """Spark's reason for a failed job, without the JVM's stack."""
    lines = [line.strip() for line in str(error).splitlines()]
    reason = [line for line in lines if line and not line.startswith("at ")]
    return "\n".join(reason[:4])


def _started(sc: Any, group: str) -> bool:
    tracker = sc.statusTracker()
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info else []:
            stage = tracker.getStageInfo(stage_id)
            if stage and stage.numActiveTasks + stage.numCompletedTasks > 0:
                return True
    return False


def _results(records: list[dict[str, Any]], num_proc: int, stdout: Any, stderr: Any,
             timestamps: bool) -> list[Any]:
    records = sorted(records, key=lambda r: r["rank"])
    for r in records:
        for stream, name in ((stdout, "stdout"), (stderr, "stderr")):
            if stream is not None and r.get(name):
                stamp = time.strftime("%a %b %d %H:%M:%S %Y") + ":" if timestamps else ""
                stream.write("".join(f"[{r['rank']}]<{name}>:{stamp}{line}\n"
                                     for line in r[name].splitlines()))
    failed = [r for r in records if "error" in r]
    if failed:
        first = min(failed, key=lambda r: r["failed_at"])
        raise RuntimeError(
            f"dtrain.spark: rank {first['rank']} on {first['host']} ({first['address']}) failed: "
            f"{first['error']}\n{first['traceback']}"
            + "".join(f"(then rank {r['rank']}: {r['error']})\n" for r in failed if r is not first))
    assert [r["rank"] for r in records] == list(range(num_proc)), [r["rank"] for r in records]
    return [r["result"] for r in records]
