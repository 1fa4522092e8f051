"""A worker that pushes an embedding's sparse gradient to a dist store and checks the table the
servers keep, row by row, against MXNet's formulas written out here.

    kv_rows_worker.py TYPE LAZY [KILL_SERVER_AT_STEP [COMPRESSION]]

Run it under `dtrain launch -n N -s S`. The store's optimizer is SGD with momentum and weight
decay on the servers, `lazy_update=LAZY` (1: MXNet's lazy update, only the rows some worker
pushed move; 0: the dense formula, every row moves). Each worker's gradient is that of an
`nn.Embedding(sparse=True)` over ids that differ between workers, overlap and repeat. After each
step every worker pulls the whole table with row_sparse_pull (rows only) and compares. With
KILL_SERVER_AT_STEP (under `dtrain launch --max-restarts 1`), rank 0 kills server 1 right after
its push of that step, in its first life: the server's replacement restores its checkpoint, the
workers repeat their pushes since, and every row must still come out exact (-1: no kill). With
COMPRESSION fp16 the rows travel as float16: each worker's rows (repeats summed) are rounded so
before the servers sum them. Prints
"kv_rows_worker OK rank R of N" at the end.
"""

import os
import signal
import sys

import torch

import dtrain

ROWS, DIM, STEPS = 1000, 8, 3
LR, MOMENTUM, WD = 0.1, 0.9, 0.01


def ids_of(rank, step):
    first = (rank * 13 + step * 7) % ROWS
    ids = [(first + k * (rank + 3)) % ROWS for k in range(10)]
    return torch.tensor(ids + ids[:2])  # two repeats: their rows' gradients add up


def sparse_grad(rank, step, scale):
    """nn.Embedding(sparse=True)'s gradient of sum(scale * emb(ids)): uncoalesced, repeats."""
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    (emb(ids_of(rank, step)) * scale).sum().backward()
    return emb.weight.grad


def scale_of(rank, step):
    return torch.arange(DIM, dtype=torch.float32) * 0.01 + (rank + 1) * 0.5 - step * 0.1


def find_server(rank):
    """The pid of this job's server `rank` (the same DMLC_PS_ROOT_PORT as ours), from /proc."""
    wanted = {b"DMLC_ROLE=server", b"DTRAIN_NODE_RANK=%d" % rank,
              b"DMLC_PS_ROOT_PORT=" + os.environ["DMLC_PS_ROOT_PORT"].encode()}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/environ" % name, "rb") as f:
                    env = set(f.read().split(b"\0"))
            except OSError:
                continue
            if wanted <= env:
                return int(name)
    raise SystemExit("cannot find server %d" % rank)


def main():
    kind, lazy = sys.argv[1], bool(int(sys.argv[2]))
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    fp16 = len(sys.argv) > 4 and sys.argv[4] == "fp16"
    kv = dtrain.kv.create(kind)
    initial = torch.arange(ROWS * DIM, dtype=torch.float32).reshape(ROWS, DIM) * 0.001 + 1
    kv.init("table", initial)
    if fp16:
        kv.set_gradient_compression({"type": "fp16"})
    kv.set_optimizer(dtrain.optimizer.create("sgd", learning_rate=LR, momentum=MOMENTUM, wd=WD,
                                             lazy_update=lazy))
    want = initial.double()
    mom = torch.zeros_like(want)
    everything = torch.arange(ROWS - 1, -1, -1)  # every row, backwards
    for step in range(STEPS):
        kv.push("table", sparse_grad(kv.rank, step, scale_of(kv.rank, step)))
        if step == kill_at and kv.rank == 0 and os.environ.get("DTRAIN_RESTART_COUNT", "0") == "0":
            os.kill(find_server(1), signal.SIGKILL)
            print("rank 0 killed server 1 after its push of step %d" % step, flush=True)
        # The reference: every worker's gradient summed; lazy: only their rows move.
        grads = [sparse_grad(r, step, scale_of(r, step)) for r in range(kv.num_workers)]
        total = sum(g.to_dense().half().float() if fp16 else g.to_dense() for g in grads).double()
        moves = torch.zeros(ROWS, dtype=torch.bool)
        for r in range(kv.num_workers):
            moves[ids_of(r, step)] = True
        if not lazy:
            moves[:] = True
        new_mom = MOMENTUM * mom - LR * WD * want - LR * total
        mom = torch.where(moves.unsqueeze(1), new_mom, mom)
        want = torch.where(moves.unsqueeze(1), want + mom, want)
        got = kv.row_sparse_pull("table", row_ids=everything)
        dense = got.to_dense()
        if not torch.allclose(dense.double(), want, rtol=1e-5, atol=1e-6):
            bad = (dense.double() - want).abs().max(dim=1).values.argmax().item()
            raise AssertionError("step %d, row %d: got %s, want %s (lazy_update=%s)"
                                 % (step, bad, dense[bad].tolist()[:4], want[bad].tolist()[:4],
                                    lazy))
        # MXNet's row_sparse `out`: the rows asked for, zeros elsewhere.
        out = torch.full((ROWS, DIM), 7.0)
        kv.row_sparse_pull("table", out=out, row_ids=torch.tensor([5, 3, 5])).wait()
        if out[4].abs().sum() != 0 or not torch.allclose(out[3].double(), want[3]):
            raise AssertionError("row_sparse_pull out: rows 3 and 5, zeros elsewhere")
    rank, workers = kv.rank, kv.num_workers
    kv.close()
    print("kv_rows_worker OK rank %d of %d" % (rank, workers))


if __name__ == "__main__":
    main()
