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
    with pytest.raises(NotImplementedError, match="run_elastic"):
        dtrain.spark.run_elastic(ranks_and_sum)


def test_the_spark_example_trains(tmp_path):
    """examples/python/spark_fashion_mnist.py as a user runs it: its own Spark, Horovod's example
    shipped to the executors, a few batches of Fashion-MNIST."""
    from conftest import run_example_on_an_engine

    out = run_example_on_an_engine("spark_fashion_mnist.py", ["--num-proc", "2", "--", "--epochs",
                                                              "1", "--max-batches", "20"],
                                   tmp_path, "SPARK_", LOOPBACK)
    assert re.search(r"\[0\]<stdout>:Epoch 0: Test_acc", out), out
