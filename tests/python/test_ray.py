"""dtrain on a real Ray cluster (a local one: `ray.init` starts its GCS, raylet and workers):
Horovod's RayExecutor API in allreduce and parameter-server mode, a rank that dies, and the Ray
Train backend. Skipped where Ray is not installed (`pip install dtrain[ray]`; the pip lane of
scripts/test-pip.sh installs it)."""

import os
import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")

import dtrain.ray  # noqa: E402
from dtrain.ray import RayExecutor  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Logical CPUs: each actor asks for one, and this machine may have 2 cores.
    # The actors import this file's functions by name (cloudpickle pickles a module's functions
    # by reference): its folder goes on their path, and so does the package under test. The
    # local cluster's processes inherit this process's environment.
    path = [os.path.dirname(os.path.abspath(__file__))] + sys.path
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    # Two GPUs as Ray's resources (none need exist): Ray hands them out and sets each actor's
    # CUDA_VISIBLE_DEVICES as on a GPU node; no test here touches CUDA.
    ray.init(address="local", num_cpus=6, num_gpus=2, include_dashboard=False, log_to_driver=True,
             _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield
    ray.shutdown()


def allreduce_sum():
    import dtrain.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    env = (os.environ["HOROVOD_RANK"], os.environ["HOROVOD_LOCAL_RANK"])
    out = (hvd.rank(), hvd.size(), hvd.local_rank(), float(total[0]), env)
    hvd.shutdown()
    return out


def test_run_gives_each_ranks_result_in_rank_order(cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=3)
    executor.start()
    try:
        results = executor.run(allreduce_sum)
    finally:
        executor.shutdown()
    # One node: the ranks are its local ranks, and horovodrun's variables agree with init().
    assert results == [(r, 3, r, 6.0, (str(r), str(r))) for r in range(3)], results


class Counter:
    def __init__(self, start):
        self.count = start

    def bump(self):
        self.count += 1
        return self.count


def test_execute_keeps_each_workers_executable(cluster):
    executor = RayExecutor(num_workers=2)
    executor.start(executable_cls=Counter, executable_args=[10])
    try:
        assert executor.execute(lambda c: c.bump()) == [11, 11]
        assert executor.execute(lambda c: c.bump()) == [12, 12]
        assert executor.execute_single(lambda c: c.bump()) == 13
        refs = executor.run_remote(lambda x: x * 2, args=[21])
        assert ray.get(refs) == [42, 42]
    finally:
        executor.shutdown()


def visible_gpus():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ["HOROVOD_LOCAL_RANK"]


def test_each_rank_sees_its_nodes_gpus_as_horovods_executor_shows_them(cluster):
    """Horovod's scripts call torch.cuda.set_device(hvd.local_rank()): every rank of a node sees
    the GPUs Ray gave the node's ranks, local rank i's own i-th."""
    executor = RayExecutor(num_workers=2, use_gpu=True)
    executor.start()
    try:
        own = executor.execute(lambda _: [str(i) for i in ray.get_gpu_ids()])
        results = executor.run(visible_gpus)
    finally:
        executor.shutdown()
    both = ",".join(own[0] + own[1])
    assert sorted(both.split(",")) == ["0", "1"], own
    assert results == [(both, "0"), (both, "1")], results


def kv_sum():
    import dtrain

    kv = dtrain.kv.create("dist_sync")
    kv.init(3, torch.zeros(4))
    kv.push(3, torch.full((4,), float(kv.rank + 1)))
    out = kv.pull(3)  # dist_sync: the round's sum, once every worker pushed
    return kv.rank, kv.num_workers, out.tolist()


def test_parameter_servers_are_actors_too(cluster):
    executor = RayExecutor(num_workers=2, num_servers=2)
    executor.start()
    try:
        results = executor.run(kv_sum)
    finally:
        executor.shutdown()
    assert results == [(0, 2, [3.0] * 4), (1, 2, [3.0] * 4)], results


def kv_rounds_losing_rank_1(rounds):
    """dist_sync rounds of which rank 1's first actor dies before pushing round 5: its replacement
    rejoins there (kv.rounds_done) and every round still sums both ranks' pushes."""
    import dtrain

    kv = dtrain.kv.create("dist_sync")
    kv.init(3, torch.zeros(4))
    start = kv.rounds_done
    for r in range(start, rounds):
        if r == 5 and kv.rank == 1 and not kv.rejoined:
            os._exit(3)  # the actor's process dies without a word
        kv.push(3, torch.full((4,), float(kv.rank + 1)))
        got = kv.pull(3)
        assert got.tolist() == [3.0] * 4, (r, got)
    return kv.rank, start, kv.rejoined


def test_max_restarts_replaces_a_lost_worker_which_rejoins_the_job(cluster):
    executor = RayExecutor(num_workers=2, num_servers=1, max_restarts=1)
    executor.start()
    try:
        results = executor.run(kv_rounds_losing_rank_1, args=[10])
        assert executor.restarts == 1
    finally:
        executor.shutdown()
    assert results == [(0, 0, False), (1, 5, True)], results


def test_an_elastic_job_goes_on_without_a_lost_worker(cluster, tmp_path):
    from dtrain.ray import ElasticRayExecutor

    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=2, max_np=3))
    executor.start()
    from conftest import elastic_steps

    results = executor.run(elastic_steps, args=(20, str(tmp_path / "died")))
    assert (tmp_path / "died").exists()
    # Every worker that ended the job went through all the steps, in one membership at the end.
    assert len(results) in (2, 3) and results == [(20, len(results))] * len(results), results


def test_an_elastic_job_the_cluster_cannot_hold_fails_saying_why(cluster, tmp_path):
    from dtrain.ray import ElasticRayExecutor

    # 7 workers of 1 CPU on a cluster of 6: below --min-np until the elastic timeout.
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=7, max_np=7,
                                                                     elastic_timeout=5))
    executor.start()
    from conftest import elastic_steps

    with pytest.raises(RuntimeError, match=r"(?s)dtrain launch exited 1.*fewer workers than "
                                           r"--min-np 7 after 5 s"):
        executor.run(elastic_steps, args=(20, str(tmp_path / "died")))


def die_on_rank_1():
    import dtrain.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        os._exit(3)  # the actor's process dies without a word
    for _ in range(1000):
        hvd.allreduce(torch.ones(1))


def test_a_rank_that_dies_fails_run_naming_it(cluster):
    executor = RayExecutor(num_workers=2)
    executor.start()
    try:
        with pytest.raises(RuntimeError, match=r"rank 1 on node \S+ \(.*\) failed"):
            executor.run(die_on_rank_1)
    finally:
        executor.shutdown()


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="num_workers"):
        RayExecutor(num_workers=0)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(num_workers=1, gpus_per_worker=1)
    with pytest.raises(NotImplementedError, match="ElasticRayExecutor"):
        RayExecutor(min_workers=1, max_workers=2)
    with pytest.raises(ValueError, match="max_restarts replaces workers of parameter-server"):
        RayExecutor(num_workers=2, max_restarts=1)
    with pytest.raises(RuntimeError, match="start"):
        RayExecutor(num_workers=1).run(allreduce_sum)
    from dtrain.ray import ElasticRayExecutor

    with pytest.raises(ValueError, match="max_np 1 is below min_np 2"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=2, max_np=1))


def train_fn(config):
    import dtrain.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    report_with_rank_0s_checkpoint({"sum": float(total[0]), "size": hvd.size()}, total)


def report_with_rank_0s_checkpoint(metrics, total):
    """Ray Train keeps the metrics reported with a checkpoint: rank 0 saves `total` in one, as a
    script saves its model."""
    import tempfile

    import ray.train

    import dtrain.torch as hvd

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if hvd.rank() == 0:
            torch.save(total, os.path.join(folder, "total.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def test_ray_train_runs_a_dtrain_job(cluster, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    trainer = DataParallelTrainer(train_fn, backend_config=dtrain.ray.Config(),
                                  scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(storage_path=str(tmp_path), name="job"))
    result = trainer.fit()
    assert result.error is None, result.error
    assert result.metrics == {"sum": 3.0, "size": 2}, result.metrics
    with result.checkpoint.as_directory() as folder:
        assert float(torch.load(os.path.join(folder, "total.pt"))[0]) == 3.0


def train_on_gpus(config):
    import dtrain.torch as hvd

    hvd.init()
    visible = hvd.allgather_object(os.environ.get("CUDA_VISIBLE_DEVICES"))
    report_with_rank_0s_checkpoint({"visible": visible}, torch.zeros(1))


def test_ray_train_workers_see_their_nodes_gpus(cluster, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    trainer = DataParallelTrainer(train_on_gpus, backend_config=dtrain.ray.Config(),
                                  scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                                  run_config=RunConfig(storage_path=str(tmp_path), name="job"))
    result = trainer.fit()
    assert result.error is None, result.error
    visible = result.metrics["visible"]
    assert visible[0] == visible[1] and sorted(visible[0].split(",")) == ["0", "1"], visible


def train_resuming(config):
    import tempfile

    import ray.train

    import dtrain.torch as hvd

    hvd.init()
    start, resumed = 0, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "epoch")) as f:
                start = resumed = int(f.read()) + 1
    for epoch in range(start, 3):
        if epoch == 2 and resumed is None and hvd.rank() == 1:
            time.sleep(1)  # Ray Train registers the checkpoints reported so far
            os._exit(5)  # a worker lost in its first life
        total = hvd.allreduce(torch.tensor([float(epoch)]), op=hvd.Sum)
        with tempfile.TemporaryDirectory() as folder:
            saved = None
            if hvd.rank() == 0:
                with open(os.path.join(folder, "epoch"), "w") as f:
                    f.write(str(epoch))
                saved = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({"epoch": epoch, "sum": float(total[0]), "resumed": resumed},
                             checkpoint=saved)


def test_ray_train_restarts_a_failed_dtrain_job_from_its_checkpoint(cluster, tmp_path):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    trainer = DataParallelTrainer(
        train_resuming, backend_config=dtrain.ray.Config(),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="job",
                             failure_config=FailureConfig(max_failures=1)))
    result = trainer.fit()
    assert result.error is None, result.error
    # The second group (a new job: a fresh rendezvous and secret) went on from the last
    # checkpoint Ray Train had registered (epoch 1's, or epoch 0's if the failure beat it).
    assert result.metrics["epoch"] == 2 and result.metrics["sum"] == 4.0, result.metrics
    assert result.metrics["resumed"] in (1, 2), result.metrics


def test_the_ray_example_trains(tmp_path):
    """examples/python/ray_fashion_mnist.py as a user runs it: its own local Ray, Horovod's
    example shipped to the actors (working_dir), a few batches of Fashion-MNIST."""
    from conftest import run_example_on_an_engine

    out = run_example_on_an_engine("ray_fashion_mnist.py", ["--num-workers", "2", "--", "--epochs",
                                                            "1", "--max-batches", "20"],
                                   tmp_path, "RAY_")
    assert "Epoch 0: Test_acc" in out, out
