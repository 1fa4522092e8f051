"""dtrain.kv: every store type through real jobs (dtrain launch, 1 to 4 workers), checked
exactly by programs/kv_worker.py, and the API's errors in one process."""

import pytest
import torch

from conftest import job_env, launch_argv, program, run_ok

import dtrain

BIG = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}  # the 5000-element key is split over the servers


def check(out, workers, kind):
    for r in range(workers):
        assert "kv_worker OK rank %d of %d (%s)" % (r, workers, kind) in out, out


@pytest.mark.parametrize("kind,workers,servers,devices", [
    ("dist_sync", 1, 1, 1),
    ("dist_sync", 2, 2, 1),
    ("dist_sync", 4, 2, 1),
    ("dist_sync_device", 2, 1, 2),
    ("dist_async", 2, 1, 1),
    ("dist_async", 3, 2, 1),
    ("dist_async_device", 2, 2, 2),
    ("horovod", 1, 0, 1),
    ("horovod", 3, 0, 2),
])
def test_store_type_through_dtrain_launch(spawn, kind, workers, servers, devices):
    from conftest import job_env
    out = run_ok(spawn, launch_argv(workers, servers,
                                    program("kv_worker.py", kind, "--devices", devices)),
                 env=job_env(BIG))
    check(out, workers, kind)


@pytest.mark.parametrize("kind,devices", [("local", 1), ("local", 3), ("device", 2)])
def test_local_store_types(spawn, kind, devices):
    out = run_ok(spawn, program("kv_worker.py", kind, "--devices", devices))
    check(out, 1, kind)


@pytest.mark.parametrize("kind,workers,servers,lazy,compression", [
    ("dist_sync", 1, 1, 1, "none"),
    ("dist_sync", 2, 2, 1, "none"),
    ("dist_sync", 3, 2, 0, "none"),
    ("dist_sync", 2, 3, 1, "none"),  # three servers: the table's slots over three
    ("dist_sync", 2, 2, 1, "fp16"),
])
def test_an_embeddings_sparse_gradient_moves_as_rows(spawn, kind, workers, servers, lazy,
                                                     compression):
    """Only the rows travel (as float16 with fp16 compression), and the servers update them as
    MXNet's lazy_update (or, with lazy_update=0, as the dense formula):
    programs/kv_rows_worker.py checks every row."""
    # The 1000 x 8 table over every server, in slots of 4096 bytes (128 rows).
    rows_split = {"MXNET_KVSTORE_BIGARRAY_BOUND": "256", "DTRAIN_CHUNK_BYTES": "4096"}
    out = run_ok(spawn, launch_argv(workers, servers,
                                    program("kv_rows_worker.py", kind, lazy, -1, compression)),
                 env=job_env(rows_split))
    assert out.count("kv_rows_worker OK") == workers, out


def test_rows_stay_exact_when_a_server_is_lost_and_restored(spawn):
    """Rank 0 kills server 1 after its push of step 1: the replacement restores its checkpoint
    (the slots' rows with it), the workers repeat their row pushes since, and every row of every
    step is still MXNet's lazy formula."""
    rows_split = {"MXNET_KVSTORE_BIGARRAY_BOUND": "256", "DTRAIN_CHUNK_BYTES": "4096"}
    out = run_ok(spawn, launch_argv(2, 2, program("kv_rows_worker.py", "dist_sync", 1, 1),
                                    "--max-restarts", "1"), env=job_env(rows_split))
    assert "rank 0 killed server 1 after its push of step 1" in out, out
    assert "restored" in out and out.count("kv_rows_worker OK") == 2, out


@pytest.mark.parametrize("workers,servers,lazy", [(2, 2, 1), (3, 2, 0)])
def test_trainer_moves_a_sparse_embeddings_rows(spawn, workers, servers, lazy):
    """dtrain.torch.Trainer with nn.Embedding(sparse=True) and EmbeddingBag(sparse=True): the
    tables travel as rows, each forward pulls the rows it reads, and
    programs/trainer_rows_worker.py checks every output and, after wait(), every weight against
    MXNet's lazy (or dense) SGD formulas applied to every worker's batches."""
    out = run_ok(spawn, launch_argv(workers, servers, program("trainer_rows_worker.py", lazy)))
    assert out.count("trainer_rows_worker OK") == workers, out


def test_server_embedding_trains_as_the_whole_table(spawn):
    """dtrain.torch.ServerEmbedding (an Embedding and a sum EmbeddingBag in 4 shards, one batch
    prefetched) against the same tables held whole and pushed as sparse gradients:
    programs/server_embedding_worker.py compares outputs every step and every row at the end."""
    out = run_ok(spawn, launch_argv(2, 2, program("server_embedding_worker.py")))
    assert out.count("server_embedding_worker OK") == 2, out


def test_server_embedding_needs_a_dist_store(kv):
    import dtrain.torch

    with pytest.raises(ValueError, match="dist store's servers"):
        dtrain.torch.ServerEmbedding(10, 4, kv)


def test_dist_alias_is_dist_sync(spawn):
    out = run_ok(spawn, launch_argv(2, 1, program("kv_worker.py", "dist")))
    check(out, 2, "dist")


# --- the API in one process -------------------------------------------------------------------

@pytest.fixture
def kv():
    store = dtrain.kv.create("local")
    yield store
    store.close()


def test_properties(kv):
    assert (kv.type, kv.rank, kv.num_workers) == ("local", 0, 1)


def test_tensors_cross_without_copies(kv):
    value = torch.zeros(1000)
    kv.init("w", torch.ones(1000))
    kv.pull("w", out=value).wait()
    assert value.sum().item() == 1000  # written in place, into the caller's memory
    grad = torch.full((1000,), 2.0)
    handle = kv.pushpull("w", grad)  # no out: the result is written into the value
    assert handle.wait() is grad and grad[0].item() == 2.0


def test_misuse_names_the_key(kv):
    kv.init(7, torch.zeros(3))
    with pytest.raises(ValueError, match="key 7.*already"):
        kv.init(7, torch.zeros(3))
    with pytest.raises(ValueError, match="key 'nope'"):
        kv.push("nope", torch.zeros(3))
    with pytest.raises(ValueError, match=r"key 7.*\(4,\)"):
        kv.push(7, torch.zeros(4))
    with pytest.raises(ValueError, match="out of range"):
        kv.init(-1, torch.zeros(3))
    with pytest.raises(TypeError, match="int or a str"):
        kv.init(1.5, torch.zeros(3))
    assert isinstance(dtrain.InvalidArgument("x"), ValueError)


def test_tensor_requirements_are_clear_errors(kv):
    kv.init(1, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="not contiguous"):
        kv.push(1, torch.zeros(3, 2).t())
    with pytest.raises(TypeError, match="int64"):
        kv.init(2, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="tensor or a non-empty list"):
        kv.push(1, [1.0, 2.0])
    with pytest.raises(ValueError, match="2 keys need 2 values"):
        kv.push([1, 2], torch.zeros(2, 3))
    # dtrain's own error (a ValueError too), as for every other misuse.
    with pytest.raises(dtrain.InvalidArgument, match="not contiguous"):
        kv.pushpull(1, torch.zeros(3, 2).t())
    # The shape, not only the element count, as MXNet checks it.
    with pytest.raises(dtrain.InvalidArgument, match=r"push of key 1: value 0 has shape \(3, 2\), "
                       r"but the key was initialised with shape \(2, 3\)"):
        kv.push(1, torch.zeros(3, 2))
    with pytest.raises(dtrain.InvalidArgument, match=r"shape \(6,\)"):
        kv.pull(1, out=torch.zeros(6))
    with pytest.raises(dtrain.InvalidArgument, match="out of range"):
        kv.init(2 ** 64, torch.zeros(3))
    with pytest.raises(dtrain.InvalidArgument, match="has no elements"):
        kv.init(3, torch.zeros(0))
    with pytest.raises(dtrain.InvalidArgument, match="at least one"):
        dtrain.data.split_and_load(torch.zeros(4), 0)


def test_sparse_values_and_row_sparse_pull_in_one_process(kv):
    kv.init("emb", torch.arange(12, dtype=torch.float32).reshape(6, 2))
    kv.set_optimizer(dtrain.optimizer.create("sgd", learning_rate=1.0))
    grad = torch.sparse_coo_tensor(torch.tensor([[4, 1, 4]]), torch.ones(3, 2), (6, 2))
    kv.push("emb", grad).wait()
    want = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    want[1] -= 1
    want[4] -= 2
    assert torch.equal(kv.pull("emb"), want)
    rows = kv.row_sparse_pull("emb", row_ids=torch.tensor([4, 1]))
    assert rows.is_sparse and rows.indices().tolist() == [[1, 4]]
    assert torch.equal(rows.values(), want[[1, 4]])
    with pytest.raises(dtrain.InvalidArgument, match="key 'emb' needs row_ids"):
        kv.row_sparse_pull("emb")
    with pytest.raises(dtrain.InvalidArgument, match="row id 6 is outside the key's 6 rows"):
        kv.row_sparse_pull("emb", row_ids=[0, 6])
    with pytest.raises(dtrain.InvalidArgument, match="row id -1"):
        kv.row_sparse_pull("emb", row_ids=[-1])
    with pytest.raises(dtrain.InvalidArgument, match="must be integers"):
        kv.row_sparse_pull("emb", row_ids=torch.tensor([1.0]))
    with pytest.raises(dtrain.InvalidArgument, match="one row_ids per key"):
        kv.row_sparse_pull(["emb", "emb"], row_ids=[[0, 1]])
    with pytest.raises(dtrain.InvalidArgument, match=r"shape \(3, 2\)"):
        kv.push("emb", torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 2), (3, 2)))
    with pytest.raises(dtrain.InvalidArgument, match="pass out"):
        kv.pushpull("emb", grad)
    assert torch.equal(kv.pull("emb"), want)  # nothing refused was applied
    # One out per device with its own rows (MXNet's form), and ids checked before any write.
    outs = [torch.full((6, 2), 7.0), torch.full((6, 2), 7.0)]
    kv.row_sparse_pull("emb", out=outs, row_ids=[torch.tensor([1]), [4, 4]]).wait()
    assert torch.equal(outs[0][1], want[1]) and outs[0][[0, 2, 3, 4, 5]].eq(0).all()
    assert torch.equal(outs[1][4], want[4]) and outs[1][[0, 1, 2, 3, 5]].eq(0).all()
    untouched = torch.full((6, 2), 7.0)
    with pytest.raises(dtrain.InvalidArgument, match="row id 9"):
        kv.row_sparse_pull("emb", out=untouched, row_ids=[9])
    assert untouched.eq(7.0).all()
    empty = kv.row_sparse_pull("emb", row_ids=[])
    assert empty.is_sparse and empty._nnz() == 0


def test_a_refused_push_changes_nothing(kv):
    kv.init(4, torch.ones(3))
    with pytest.raises(ValueError):
        kv.push(4, [torch.ones(3), torch.ones(2)])
    assert kv.pull(4).tolist() == [1.0, 1.0, 1.0]


def test_optimizer_errors_name_the_parameter():
    with pytest.raises(ValueError, match="momentum"):
        dtrain.optimizer.create("sgd", learning_rate=0.1, momentum=1.5)
    with pytest.raises(ValueError, match="no parameter 'betta1'"):
        dtrain.optimizer.create("adam", betta1=0.9)
    with pytest.raises(ValueError, match="unknown"):
        dtrain.optimizer.create("lamb")
    opt = dtrain.optimizer.create("sgd", learning_rate=0.1, multi_precision=True,
                                  clip_gradient=None,
                                  lr_scheduler=dtrain.lr_scheduler.FactorScheduler(step=10))
    assert opt.learning_rate == 0.1


def test_optimizer_state_round_trip(kv, tmp_path):
    kv.init(0, torch.ones(4))
    kv.set_optimizer(dtrain.optimizer.create("adam", learning_rate=0.1))
    kv.push(0, torch.ones(4))
    path = str(tmp_path / "opt")
    kv.save_optimizer_states(path)
    after_one = kv.pull(0)
    kv.push(0, torch.ones(4))
    after_two = kv.pull(0)
    other = dtrain.kv.create("local")
    other.init(0, after_one)
    other.set_optimizer(dtrain.optimizer.create("adam", learning_rate=0.1))
    other.load_optimizer_states(path)
    other.push(0, torch.ones(4))
    assert torch.equal(other.pull(0), after_two)  # Adam's moments and count came back
    other.close()


def test_set_gradient_compression_is_checked_and_fixed_at_the_first_push(kv):
    with pytest.raises(ValueError, match="unknown gradient compression type '3bit'"):
        kv.set_gradient_compression({"type": "3bit"})
    with pytest.raises(TypeError, match="dict"):
        kv.set_gradient_compression("2bit")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init(9, torch.zeros(3))
    kv.push(9, [torch.full((3,), 0.6), torch.full((3,), 0.2)])  # two devices: compressed
    assert kv.pull(9).tolist() == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="before the first push"):
        kv.set_gradient_compression({"type": "none"})


def test_unknown_type():
    with pytest.raises(ValueError, match="unknown kvstore type 'dist_fast'"):
        dtrain.kv.create("dist_fast")


def test_dist_type_outside_a_job_says_what_is_missing():
    with pytest.raises(dtrain.ConfigError, match="DMLC_"):
        dtrain.kv.create("dist_sync")


def test_closed_store_refuses_calls(kv):
    kv.close()
    with pytest.raises(ValueError, match="closed"):
        kv.push(0, torch.zeros(1))
