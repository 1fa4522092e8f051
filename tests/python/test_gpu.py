"""CUDA tensors through dtrain's APIs on a real GPU: every kvstore type gives exactly the values
the CPU path gives (programs/kv_worker.py --cuda: D replicas on the one GPU stand in for D devices
per worker, worker processes sharing it for hosts), and Horovod's collectives on CUDA tensors
(host staging over Gloo with 2 ranks, NCCL with 1) equal the CPU results (programs/hvd_worker.py,
hvd_collectives_worker.py, hvd_process_sets_worker.py and hvd_adasum_worker.py with --cuda:
process sets, SyncBatchNorm and Adasum too), and two ranks on one GPU over NCCL fail saying why;
Horovod's hierarchical allreduce over NCCL works on one host and across two emulated hosts
(programs/hvd_hierarchical_worker.py: pid namespaces stand in for hosts); a local store's own
optimizer updates CUDA values on the GPU as the host path does; the Trainer on CUDA parameters
reaches what one process reaches on the whole batch (programs/train_check.py --cuda),
dtrain-train --gpus trains as its CPU replicas do, and so does the C++ Horovod API
(dtrain-horovod-example --gpus).

Skipped, with the reason, where there is no GPU, where torch has no CUDA, or where dtrain was built
without CUDA (CI: the toolkit but no GPU). scripts/gpu-check.sh runs them on a GPU machine.
"""

import os
import re
import subprocess

import pytest
import torch

from conftest import BUILD, TRAIN, job_env, launch_argv, program, run_ok
from test_horovod import relative_difference

import dtrain

if not dtrain._dtrain.cuda_built():
    pytest.skip("dtrain was built without CUDA", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no usable CUDA GPU (torch %s: %s)" % (
        torch.__version__, "CUDA build" if torch.version.cuda else "no CUDA in this torch build"),
        allow_module_level=True)
if dtrain._dtrain.cuda_device_count() == 0:
    pytest.skip("dtrain sees no CUDA device: " + dtrain._dtrain.cuda_unavailable(),
                allow_module_level=True)

# The 5000-element key is split over the servers: a dist store's staging copies its values to and
# from the GPU in pieces of at most 1024 floats (DTRAIN_CHUNK_BYTES, whose least is 4096 bytes).
BIG = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000", "DTRAIN_CHUNK_BYTES": "4096"}


def check(out, workers, kind, worker="kv_worker"):
    for r in range(workers):
        assert "%s OK rank %d of %d (%s)" % (worker, r, workers, kind) in out, out


@pytest.mark.parametrize("kind,devices", [("local", 1), ("local", 3), ("device", 2)])
def test_local_store_types_on_cuda(spawn, kind, devices):
    out = run_ok(spawn, program("kv_worker.py", kind, "--devices", devices, "--cuda"))
    check(out, 1, kind)


@pytest.mark.parametrize("kind,workers,servers,devices", [
    ("dist_sync", 1, 1, 1),
    ("dist_sync", 2, 2, 2),
    ("dist_sync_device", 2, 1, 2),
    ("dist_async", 2, 1, 1),
    ("dist_async_device", 2, 2, 2),
    ("horovod", 2, 0, 2),
])
def test_store_types_on_cuda_through_dtrain_launch(spawn, kind, workers, servers, devices):
    out = run_ok(spawn, launch_argv(workers, servers, program(
        "kv_worker.py", kind, "--devices", devices, "--cuda")), env=job_env(BIG))
    check(out, workers, kind)


@pytest.mark.parametrize("kind,workers,servers", [
    ("dist_sync", 2, 2),
    ("dist_sync_device", 2, 1),
    ("device", 1, 0),
])
def test_gradient_compression_on_cuda_gives_mxnets_sums(spawn, kind, workers, servers):
    # The dist stores compress their sum on the GPU, the device store each replica's value on its
    # GPU, as MXNet's does: only the compressed bytes reach the host.
    argv = program("gc_worker.py", kind, "--cuda")
    if kind.startswith("dist"):
        argv = launch_argv(workers, servers, argv)
    out = run_ok(spawn, argv, env=job_env(BIG))
    for r in range(workers):
        assert "gc_worker OK rank %d" % r in out, out


def test_horovod_api_on_cuda_tensors_through_host_memory(spawn):
    # Two ranks share the one GPU: NCCL refuses that, host staging does not.
    out = run_ok(spawn, launch_argv(2, 0, program("hvd_worker.py", "--cuda")),
                 env=job_env({"HOROVOD_GPU_OPERATIONS": "GLOO"}))
    check(out, 2, "gloo", worker="hvd_worker")


needs_nccl = pytest.mark.skipif(not dtrain._dtrain.nccl_built(),
                                reason="dtrain was built without NCCL")


@needs_nccl
def test_horovod_api_on_cuda_tensors_over_nccl(spawn):
    # NCCL's default where it is built; one rank, as NCCL takes one GPU per rank.
    out = run_ok(spawn, launch_argv(1, 0, program("hvd_worker.py", "--cuda")))
    check(out, 1, "gloo, nccl", worker="hvd_worker")


@needs_nccl
def test_two_ranks_on_one_gpu_over_nccl_fail_saying_why(spawn):
    argv = launch_argv(2, 0, program("hvd_worker.py", "--cuda"))
    p = spawn(argv, job_env({"HOROVOD_GPU_OPERATIONS": "NCCL"}))
    code = p.wait(120)
    out = p.output()
    assert code != 0, out
    assert "NCCL needs one GPU per rank, but ranks 0 and 1 both use the GPU" in out, out
    assert "HOROVOD_GPU_OPERATIONS=GLOO" in out, out


def pid_namespaces_allowed():
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HIERARCHICAL = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "PS_VERBOSE": "1"}


@needs_nccl
def test_hierarchical_allreduce_over_nccl_on_one_host(spawn):
    """HOROVOD_HIERARCHICAL_ALLREDUCE=1 with one rank: the host's communicator alone, no shards
    to cross."""
    out = run_ok(spawn, launch_argv(1, 0, program("hvd_hierarchical_worker.py")),
                 env=job_env(HIERARCHICAL))
    assert "hvd_hierarchical OK rank 0 of 1" in out, out
    assert "rank 0 is local rank 0 of 1 on one of 1 hosts" in out, out


@needs_nccl
@pytest.mark.skipif(not pid_namespaces_allowed(),
                    reason="unshare --pid is not allowed here (it needs root or user namespaces)")
def test_hierarchical_allreduce_over_nccl_across_two_emulated_hosts(spawn):
    """Two ranks on the one GPU, each in a pid namespace of its own, which dtrain counts as a host
    of its own: each host's NCCL communicator has one rank, and every allreduce's shard crosses
    between them in host memory over Gloo."""
    unshare = ["unshare", "--pid", "--fork", "--kill-child"]
    argv = launch_argv(2, 0, unshare + program("hvd_hierarchical_worker.py"))
    out = run_ok(spawn, argv, env=job_env(HIERARCHICAL))
    for r in range(2):
        assert "rank %d is local rank 0 of 1 on one of 2 hosts" % r in out, out
        assert "hvd_hierarchical OK rank %d of 2" % r in out, out


def test_rest_of_horovods_collectives_on_cuda_through_host_memory(spawn):
    """Min/Max/Product, alltoall, reducescatter and every collective's gradient on CUDA tensors,
    two ranks sharing the GPU."""
    out = run_ok(spawn, launch_argv(2, 0, program("hvd_collectives_worker.py", "--cuda")),
                 env=job_env({"HOROVOD_GPU_OPERATIONS": "GLOO"}))
    check(out, 2, "gloo", worker="hvd_collectives")


@needs_nccl
def test_rest_of_horovods_collectives_on_cuda_over_nccl(spawn):
    out = run_ok(spawn, launch_argv(1, 0, program("hvd_collectives_worker.py", "--cuda")))
    check(out, 1, "gloo", worker="hvd_collectives")


def test_adasum_on_cuda_through_host_memory(spawn):
    """op=Adasum on CUDA tensors (allreduce, grouped, in place, scaled, its gradient), two ranks
    sharing the GPU: equal to the reference tree within Horovod's tolerance."""
    out = run_ok(spawn, launch_argv(2, 0, program("hvd_adasum_worker.py", "--cuda")),
                 env=job_env({"HOROVOD_GPU_OPERATIONS": "GLOO"}))
    check(out, 2, "gloo", worker="hvd_adasum")


def test_process_sets_and_sync_batch_norm_on_cuda(spawn, tmp_path):
    out = run_ok(spawn, launch_argv(2, 0, program("hvd_process_sets_worker.py", str(tmp_path),
                                                  "--cuda")),
                 env=job_env({"HOROVOD_GPU_OPERATIONS": "GLOO"}))
    check(out, 2, "gloo", worker="hvd_process_sets")


def test_device_store_sums_replicas_on_the_gpu_exactly():
    """Two float16 replicas whose sum rounds: the GPU's sum is the host's, bit for bit."""
    kv = dtrain.kv.create("device")
    a = torch.linspace(-3, 3, 4099, dtype=torch.float16)
    b = torch.linspace(0.1, 7, 4099, dtype=torch.float16)
    kv.init(0, torch.zeros(4099, dtype=torch.float16))
    kv.push(0, [a.cuda(), b.cuda()])
    on_gpu = kv.pull(0)
    kv.push(0, [a, b])
    assert torch.equal(on_gpu.cpu(), kv.pull(0).cpu())
    kv.close()


@pytest.mark.parametrize("kind,replicas", [("local", 1), ("device", 2)])
def test_store_optimizer_updates_cuda_values_on_the_gpu_as_on_the_host(tmp_path, kind, replicas):
    """MXNet's local stores keep a key's weight on the GPU of its merged gradient and run their
    optimizer there: rounds of Adam give the host path's pulls and saved state bit for bit, and a
    pull into a CPU tensor reads the weight from the GPU."""
    torch.manual_seed(3)
    weight = torch.randn(4099)
    rounds = [[torch.randn(4099) for _ in range(replicas)] for _ in range(4)]
    pulled, state = {}, {}
    for where in ("cuda", "cpu"):
        kv = dtrain.kv.create(kind)
        kv.init(0, weight.to(where))
        kv.set_optimizer(dtrain.optimizer.create("adam", learning_rate=0.01, wd=0.001))
        pulled[where] = []
        for grads in rounds:
            kv.push(0, [g.to(where) for g in grads])
            out = torch.empty(4099, device=where)
            kv.pull(0, out=out).wait()
            pulled[where].append(out.cpu())
        on_host = torch.empty(4099)
        kv.pull(0, out=on_host).wait()
        pulled[where].append(on_host)
        kv.save_optimizer_states(str(tmp_path / where))
        state[where] = (tmp_path / where).read_bytes()
        kv.close()
    for gpu, cpu in zip(pulled["cuda"], pulled["cpu"]):
        assert torch.equal(gpu.view(torch.int32), cpu.view(torch.int32))
    assert state["cuda"] == state["cpu"]


def test_pull_waits_for_the_users_stream():
    """A value written by a kernel still queued on a side stream is what gets pushed, and a pull's
    result is in place before the user's next kernel on the current stream reads it."""
    kv = dtrain.kv.create("local")
    kv.init(1, torch.zeros(1 << 20, device="cuda"))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the stream busy for tens of ms
        value = torch.full((1 << 20,), 3.0, device="cuda")
        kv.push(1, value)
    out = torch.empty(1 << 20, device="cuda")
    kv.pull(1, out=out).wait()
    assert torch.equal((out * 2).cpu(), torch.full((1 << 20,), 6.0))
    kv.close()


@pytest.mark.parametrize("workers,servers,flags", [
    (2, 2, []),  # optimizer on the servers; the small parameters fused into a bucket on the GPU
    (2, 1, ["--update-on-worker", "--devices", "2"]),  # optimizer here, on the GPU
    (1, 1, ["--no-fuse", "--devices", "2"]),
    (2, 1, ["--kvstore", "dist_sync_device", "--devices", "2"]),  # replicas summed on the GPU
    (2, 1, ["--bfloat16"]),  # float32 master weights on the servers
    (1, 1, ["--bfloat16", "--update-on-worker"]),  # float32 master weights updated on the GPU
])
def test_trainer_on_cuda_matches_one_process(spawn, workers, servers, flags):
    out = run_ok(spawn, launch_argv(workers, servers, program(
        "train_check.py", "trainer", "--cuda", *flags)))
    # bfloat16: the GPU's kernels round apart from the host's reference.
    assert relative_difference(out) < (2e-2 if "--bfloat16" in flags else 1e-4)


@pytest.mark.parametrize("kind,devices", [("local", 1), ("device", 2)])
def test_trainer_on_cuda_updates_on_the_gpu_for_local_stores(spawn, kind, devices):
    """A local store with CUDA parameters runs the optimizer on the GPU by default (as Gluon's
    Trainer updates on the device), and reaches what one process reaches on the whole batch."""
    out = run_ok(spawn, program("train_check.py", "trainer", "--cuda", "--kvstore", kind,
                                "--default-update", "--devices", str(devices)))
    assert "train_check update_on_kvstore False" in out, out
    assert relative_difference(out) < 1e-4


def test_dtrain_train_on_gpus_learns_as_on_cpu_replicas(spawn):
    """The same job with two replicas on the GPU and two on the CPU: the same test accuracy, to
    the rounding of different kernels."""
    flags = ["--dataset", "synthetic", "--network", "lenet", "--epochs", "2", "--batch-size",
             "64", "--limit-train", "8192", "--log-interval", "0"]  # 0.88 on CPUs
    accuracy = {}
    for where in (["--gpus", "0,0"], ["--devices", "2"]):
        out = run_ok(spawn, launch_argv(2, 1, [TRAIN, *flags, *where]), timeout=240)
        accuracy[where[0]] = float(re.findall(r"Test_acc ([0-9.]+)", out)[-1])
    assert accuracy["--gpus"] > 0.5, accuracy  # ten classes: learnt well beyond chance
    assert abs(accuracy["--gpus"] - accuracy["--devices"]) < 0.03, accuracy


EXAMPLE = os.path.join(BUILD, "examples", "dtrain-horovod-example")


@pytest.mark.skipif(not os.path.exists(EXAMPLE), reason="the C++ examples were not built here")
def test_cpp_horovod_api_on_cuda_trains_as_on_the_cpu(spawn, tmp_path):
    """dtrain/train/horovod.h on CUDA tensors (dtrain-horovod-example --gpus): one rank (over NCCL
    where built, flat and hierarchical) and two ranks sharing the GPU through host memory end with
    the CPU job's weights, to the rounding of different kernels."""
    flags = ["--dataset", "synthetic", "--network", "mlp", "--steps", "30", "--global-batch", "32"]

    def weights(name, ranks, extra, env):
        path = str(tmp_path / (name + ".bin"))
        argv = [EXAMPLE, *flags, "--out", path, *extra]
        if ranks > 1:
            argv = launch_argv(ranks, 0, argv)
        out = run_ok(spawn, argv, env=job_env(env), timeout=180)
        device = "cpu"
        if extra:  # over NCCL where asked, else staged through host memory
            device = "cuda:0, nccl" if name in ("nccl", "hierarchical") else "cuda:0"
        assert "rank 0 of %d (gloo, %s)" % (ranks, device) in out, out
        if name == "hierarchical":
            assert "rank 0 is local rank 0 of 1 on one of 1 hosts" in out, out
        with open(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)

    cpu = weights("cpu", 1, [], {})
    jobs = [("staged", 2, {"HOROVOD_GPU_OPERATIONS": "GLOO"})]
    if dtrain._dtrain.nccl_built():
        jobs += [("nccl", 1, {"HOROVOD_GPU_OPERATIONS": "NCCL"}),
                 ("hierarchical", 1, {"HOROVOD_GPU_OPERATIONS": "NCCL", **HIERARCHICAL})]
    for name, ranks, env in jobs:
        got = weights(name, ranks, ["--gpus"], env)
        assert got.shape == cpu.shape, name
        difference = ((got - cpu).abs().max() / cpu.abs().max()).item()
        assert difference < 1e-3, (name, difference)


@pytest.mark.parametrize("gpus", ["0,", ",0", "0,,0", "x", "99"])
def test_dtrain_train_refuses_a_malformed_gpu_list(spawn, gpus):
    p = spawn([TRAIN, "--dataset", "synthetic", "--gpus", gpus, "--epochs", "1"])
    assert p.wait(60) != 0
    assert "is not a CUDA device id" in p.output(), p.output()
