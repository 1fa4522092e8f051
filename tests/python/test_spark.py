"""dtrain on a real Spark: `local-cluster[2,1,1024]` mode, a master and two executors (JVMs) on
this machine, each running the tasks' Python workers as a cluster's would. Horovod's
`horovod.spark.run` API: results in rank order, ranks and local ranks, a rank that raises, a task
whose process dies, a stage Spark cannot start, and the Fashion-MNIST example.

Skipped, with the reason, without pyspark (`pip install dtrain[spark]`; the pip lane of
scripts/test-pip.sh installs it) or a Java runtime."""

import io
import os
import re
import shutil
import sys
import time

import pytest
import torch

pyspark = pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("needs a Java runtime (Debian's openjdk-17-jre-headless)", allow_module_level=True)

import dtrain.spark  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Spark names this machine by its host name, which a CI container may not resolve: loopback,
# where every test here runs.
LOOPBACK = {"SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    os.environ.update(LOOPBACK)  # read by the JVMs this starts
    # The executors' Python workers import this file's functions and the package under test.
    path = os.pathsep.join([HERE] + sys.path)
    work = tmp_path_factory.mktemp("spark")
    session = (SparkSession.builder.master("local-cluster[2,1,1024]")
               .appName("dtrain-test-spark")
               .config("spark.ui.enabled", "false")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", path)
               .config("spark.local.dir", str(work))
               .config("spark.worker.dir", str(work))
               .getOrCreate())
    try:
        yield session
    finally:
        session.stop()


def ranks_and_sum():
    import dtrain.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), float(total[0]),
            os.environ.get("WHO"), os.getpid())


def test_run_gives_each_ranks_result_in_rank_order(spark):
    first = dtrain.spark.run(ranks_and_sum, num_proc=2, env={"WHO": "first"})
    # One host: both ranks are its local ranks.
    assert [r[:6] for r in first] == [(0, 2, 0, 2, 3.0, "first"), (1, 2, 1, 2, 3.0, "first")]
    # Spark reuses its Python workers: a second job in them starts clean (its own ranks, no
    # variable of the first's, dtrain's collectives initialised again).
    second = dtrain.spark.run(ranks_and_sum, num_proc=2)
    assert [r[:6] for r in second] == [(0, 2, 0, 2, 3.0, None), (1, 2, 1, 2, 3.0, None)]
    print("python workers: first", [r[6] for r in first], "second", [r[6] for r in second])


def say_hello(word):
    import dtrain.torch as hvd

    hvd.init()
    print(f"{word} from {hvd.rank()}")
    return word


def test_output_comes_back_prefixed_with_the_rank(spark):
    out = io.StringIO()
    assert dtrain.spark.run(say_hello, args=("hi",), num_proc=2, stdout=out) == ["hi", "hi"]
    assert out.getvalue().splitlines() == ["[0]<stdout>:hi from 0", "[1]<stdout>:hi from 1"]


def fail_on_rank_1(log):
    import dtrain.torch as hvd

    hvd.init()
    with open(log, "a") as f:
        f.write(f"ran {hvd.rank()}\n")
    if hvd.rank() == 1:
        raise ValueError("rank 1's bad batch")
    for _ in range(1000):  # waits on rank 1: dtrain fails it within seconds
        hvd.allreduce(torch.ones(1))


def test_a_rank_that_raises_fails_run_naming_it_and_runs_once(spark, tmp_path):
    log = tmp_path / "runs"
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 on \S+ \(\S+\) failed: ValueError: rank 1's "
                                           r"bad batch"):
        dtrain.spark.run(fail_on_rank_1, args=(str(log),), num_proc=2)
    print("run raised after %.1f s" % (time.monotonic() - start))
    assert sorted(log.read_text().splitlines()) == ["ran 0", "ran 1"]  # no second attempt


def die_on_rank_1(log):
    import dtrain.torch as hvd

    hvd.init()
    with open(log, "a") as f:
        f.write(f"ran {hvd.rank()}\n")
    if hvd.rank() == 1:
        os._exit(3)  # the Python worker dies without a word
    for _ in range(1000):
        hvd.allreduce(torch.ones(1))


def test_a_task_whose_process_dies_fails_run_without_running_fn_again(spark, tmp_path):
    log = tmp_path / "runs"
    with pytest.raises(RuntimeError, match=r"process died"):
        dtrain.spark.run(die_on_rank_1, args=(str(log),), num_proc=2)
    assert sorted(log.read_text().splitlines()) == ["ran 0", "ran 1"]
    # The cluster is still usable.
    assert [r[0] for r in dtrain.spark.run(ranks_and_sum, num_proc=2)] == [0, 1]


def test_more_ranks_than_task_slots_times_out_naming_them(spark):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not start the 3 tasks within 5 s.* has 2"):
        dtrain.spark.run(ranks_and_sum, num_proc=3, start_timeout=5)
    assert time.monotonic() - start < 120


def test_bad_arguments_are_refused_before_anything_starts(spark):
    with pytest.raises(ValueError, match="use_mpi"):
        dtrain.spark.run(ranks_and_sum, use_mpi=True)
    with pytest.raises(ValueError, match="reset_limit"):
        dtrain.spark.run_elastic(ranks_and_sum, reset_limit=2)
    with pytest.raises(ValueError, match="min_np 3, max_np 2"):
        dtrain.spark.run_elastic(ranks_and_sum, min_np=3, max_np=2)


def test_run_elastic_goes_on_without_a_lost_worker(spark, tmp_path):
    from conftest import elastic_steps

    out = io.StringIO()
    results = dtrain.spark.run_elastic(elastic_steps, args=(20, str(tmp_path / "died")),
                                       num_proc=2, min_np=1, stdout=out)
    assert (tmp_path / "died").exists()
    # Every worker that ended the job went through all the steps, in one membership at the end.
    assert len(results) in (1, 2) and results == [(20, len(results))] * len(results), (
        results, out.getvalue())
    assert "is retired and the other 1 go on" in out.getvalue(), out.getvalue()


def lose_a_task_then_grow_back(marker):
    """Rank 1 kills its Spark task's Python worker at step 8; the other trains alone, then on until
    the job has grown back to 2 workers (Spark retried the task, whose new agent registered) and 10 more
    steps were taken together (at most 3000 steps)."""
    import dtrain.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0, shrunk=False, regrown_at=None)

    @hvd.elastic.run
    def train(state):
        while state.step < 3000:
            if state.step == 8 and hvd.rank() == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getppid(), 9)  # the task's Python worker
            state.shrunk = state.shrunk or hvd.size() == 1
            if state.shrunk and hvd.size() == 2 and state.regrown_at is None:
                state.regrown_at = state.step
            if state.regrown_at is not None and state.step >= state.regrown_at + 10:
                break
            hvd.allreduce(torch.ones(1))
            time.sleep(0.01)
            state.step += 1
            state.commit()
        return hvd.size(), state.regrown_at is not None

    return train(state)


def test_run_elastic_goes_on_when_a_task_is_lost_and_spark_starts_it_again(spark, tmp_path):
    out = io.StringIO()
    results = dtrain.spark.run_elastic(lose_a_task_then_grow_back, args=(str(tmp_path / "died"),),
                                       num_proc=2, min_np=1, stdout=out)
    text = out.getvalue()
    assert re.search(r"the worker's Spark task \d \(attempt 0\) on \S+ \(127\.0\.0\.1:\d+\) was "
                     r"lost", text), text
    assert results == [(2, True), (2, True)], (results, text)


def test_run_elastic_times_out_when_spark_cannot_start_min_np_tasks(spark):
    with pytest.raises(TimeoutError, match=r"started 2 of the 3 tasks needed \(min_np\) within "
                                           r"5 s.* has 2 task slots"):
        dtrain.spark.run_elastic(ranks_and_sum, num_proc=3, start_timeout=5)
    # The tasks that started were told to end: the cluster is free again.
    assert [r[0] for r in dtrain.spark.run(ranks_and_sum, num_proc=2)] == [0, 1]


def test_strangers_at_the_registry_are_dropped_and_change_nothing():
    """run_elastic's registry (in the driver) reads untrusted network input: random bytes,
    wrong answers and oversized frames are dropped before anything else is read."""
    import random
    import socket
    import struct

    from dtrain.spark import _agents, _wire

    registry = _agents.Registry("the-token")
    try:
        address = ("127.0.0.1", registry.port)
        member = _wire.join(address, "the-token", {"role": "agent", "address": "127.0.0.1",
                                                    "port": 1, "task": 0, "attempt": 0})
        rng = random.Random(7)
        blobs = [rng.randbytes(rng.randrange(0, 300)) for _ in range(100)]
        blobs += [struct.pack("!cI", b"a", 1 << 31), struct.pack("!cI", b"a", 32) + b"x" * 32]
        for blob in blobs:
            with socket.create_connection(address) as s:
                s.settimeout(10)
                try:
                    s.sendall(blob)
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(1024):  # the registry hangs up
                        pass
                except (ConnectionResetError, BrokenPipeError, OSError) as e:
                    assert not isinstance(e, TimeoutError), e  # it hung up, early
        with pytest.raises(OSError):  # the wrong token: no list
            _agents.list_agents(address, "not-the-token")
        assert [a["task"] for a in _agents.list_agents(address, "the-token")] == [0]
        member.close()
        deadline = time.monotonic() + 10
        while _agents.list_agents(address, "the-token") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _agents.list_agents(address, "the-token") == []  # gone with its connection
    finally:
        registry.close()


def test_the_spark_example_trains(tmp_path):
    """examples/python/spark_fashion_mnist.py as a user runs it: its own Spark, Horovod's example
    shipped to the executors, a few batches of Fashion-MNIST."""
    from conftest import run_example_on_an_engine

    out = run_example_on_an_engine("spark_fashion_mnist.py", ["--num-proc", "2", "--", "--epochs",
                                                              "1", "--max-batches", "20"],
                                   tmp_path, "SPARK_", LOOPBACK)
    assert re.search(r"\[0\]<stdout>:Epoch 0: Test_acc", out), out
