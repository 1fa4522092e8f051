"""examples/python/dlrm.py's model, trained three ways with the same data, batches and optimizer
(AdaGrad), two workers on this machine; run by bench/sparse_bench.sh, which prints the table:

    ps    dtrain's parameter server (2 servers): the tables on the servers (ServerEmbedding), a
          worker pulls and pushes its batch's rows only; the MLPs' gradients pushed and pulled
    ddp   PyTorch DistributedDataParallel over gloo: every worker holds every table and allreduces
          its dense gradient (nn.Embedding without sparse gradients, as DDP users run it)
    hvd   Horovod's API on dtrain (dtrain.torch, allreduce mode over Gloo): nn.Embedding(sparse=
          True) and DistributedOptimizer(sparse_as_dense=False): each sparse gradient's ids and
          rows are allgathered (Horovod's sparse path), each worker holds every table

Each mode prints one JSON line (rank 0): steady samples/s over both workers, the bytes a worker
sends per step for the tables (counted from the step's ids: ps moves the unique rows twice, ddp
a table's whole gradient, hvd its rows to every other worker), its peak resident memory, and the
held-out AUC after the same samples.

    build/src/tools/dtrain launch -n 2 -s 2 -- python3 bench/sparse_bench.py ps
    python3 bench/sparse_bench.py ddp
    build/src/tools/dtrain launch -n 2 -s 0 -- python3 bench/sparse_bench.py hvd
"""

import argparse
import json
import os
import resource
import socket
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
import dlrm  # noqa: E402  (the model and the data)


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["ps", "ddp", "hvd"])
    ap.add_argument("--tables", default="4200000,100000,10000")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--test-samples", type=int, default=20000)
    return ap.parse_args()


def server_initial_rows(rows, dim, seed):
    """The table ServerEmbedding(rows, dim, seed=seed) starts from: its 64 MiB shards' draws."""
    shard = max(1, (64 << 20) // (dim * 4))
    return torch.cat([torch.randn(min(shard, rows - first), dim,
                                  generator=torch.Generator().manual_seed(seed + i)) * 0.01
                      for i, first in enumerate(range(0, rows, shard))])


def local_tables(sparse):
    """Tables held whole, starting as the servers' do (and, through _weight, drawing nothing from
    torch's generator: the MLPs start the same in every mode)."""
    return lambda t, rows, dim: torch.nn.Embedding(
        rows, dim, sparse=sparse, _weight=server_initial_rows(rows, dim, seed=1000 * t))


def table_bytes(mode, ids, dim, tables, workers):
    """What a worker sends per step for the tables."""
    row = dim * 4
    if mode == "ps":  # its unique rows, pulled and pushed (with their 8-byte ids)
        return sum(2 * ids[:, t].unique().numel() * (row + 8) for t in range(len(tables)))
    if mode == "ddp":  # a ring allreduce sends about twice the gradient
        return sum(2 * rows * row * (workers - 1) // workers for rows in tables)
    return sum(ids.shape[0] * (row + 8) * (workers - 1) for _ in tables)  # allgather: to each


def train(args, model, step_fn, rank, workers):
    truth = dlrm.HiddenModel([int(t) for t in args.tables.split(",")], seed=7)
    tables = [int(t) for t in args.tables.split(",")]
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")
    sent, start = 0, None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start = time.perf_counter()
        dense, ids, labels = truth.samples(args.batch, tables, seed=1 + step * workers + rank)
        loss = loss_fn(model(dense, ids), labels)
        step_fn(loss)
        if step >= args.warmup:
            sent += table_bytes(args.mode, ids, args.dim, tables, workers)
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        dense, ids, labels = truth.samples(args.test_samples, tables, seed=10**9)
        scores = torch.cat([model(dense[k:k + 4096], ids[k:k + 4096])
                            for k in range(0, args.test_samples, 4096)])
    return {"mode": args.mode, "workers": workers,
            "samples_per_s": args.steps * args.batch * workers / elapsed,
            "table_bytes_per_step": sent / args.steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "test_auc": dlrm.auc(scores, labels),
            "samples_trained": (args.warmup + args.steps) * args.batch * workers}


def run_ps(args):
    import dtrain
    import dtrain.torch

    kv = dtrain.kv.create("dist_sync")
    torch.manual_seed(0)
    model = dlrm.DLRM([int(t) for t in args.tables.split(",")], args.dim, dlrm.server_tables(kv))
    dense = list(model.named_parameters())
    kv.init([n for n, _ in dense], [p.detach() for _, p in dense])
    # torch's Adagrad adds its epsilon (1e-10) outside the square root, MXNet's (1e-7) inside,
    # where it damps a rarely seen row's first steps threefold: an epsilon of 1e-20 inside gives
    # torch's formula, so all three modes run the same optimizer.
    kv.set_optimizer(dtrain.optimizer.create(
        "adagrad", learning_rate=args.lr, eps=1e-20,
        rescale_grad=1.0 / (args.batch * kv.num_workers)))

    def step(loss):
        loss.backward()
        for name, p in dense:
            kv.push(name, p.grad)
            p.grad = None
        pulls = [kv.pull(name, out=p.data) for name, p in dense]
        for h in pulls:  # the next forward reads them
            h.wait()

    result = train(args, model, step, kv.rank, kv.num_workers)
    if kv.rank == 0:
        print(json.dumps(result), flush=True)
    kv.close()


def run_hvd(args):
    import dtrain.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = dlrm.DLRM([int(t) for t in args.tables.split(",")], args.dim, local_tables(True))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scale = 1.0 / (args.batch * hvd.size())
    opt = hvd.DistributedOptimizer(torch.optim.Adagrad(model.parameters(), lr=args.lr),
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Sum, sparse_as_dense=False)

    def step(loss):
        opt.zero_grad()
        (loss * scale).backward()
        opt.step()

    result = train(args, model, step, hvd.rank(), hvd.size())
    if hvd.rank() == 0:
        print(json.dumps(result), flush=True)


def ddp_worker(rank, args, port, workers):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=workers)
    torch.manual_seed(0)
    model = dlrm.DLRM([int(t) for t in args.tables.split(",")], args.dim, local_tables(False))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adagrad(ddp.parameters(), lr=args.lr)
    scale = 1.0 / args.batch  # DDP averages over the workers: the same step as the others

    def step(loss):
        opt.zero_grad()
        (loss * scale).backward()
        opt.step()

    result = train(args, ddp, step, rank, workers)
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def run_ddp(args, workers=2):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(ddp_worker, args=(args, port, workers), nprocs=workers)


def main():
    args = parse()
    torch.set_num_threads(1)
    {"ps": run_ps, "hvd": run_hvd, "ddp": run_ddp}[args.mode](args)


if __name__ == "__main__":
    main()
