"""A worker that checks MXNet's kvstore semantics exactly, for one store type.

    kv_worker.py TYPE [--devices D] [--big N] [--cuda]

Run it under `dtrain launch` (dist types, `-s 0` for horovod) or alone (local, device). With
--cuda every tensor is made on the GPU (the D devices are D replicas on cuda:0), and the same
exact values are expected. Every check compares exact values; any difference raises, so the job fails naming the check. Prints
"kv_worker OK rank R of N" at the end.
"""

import argparse
import os
import sys
import tempfile

import torch

import dtrain


def expect(name, got, want):
    got, want = got.cpu(), want.cpu()
    if not torch.equal(got, want):
        raise AssertionError("%s: got %s, want %s" % (name, got.flatten()[:8].tolist(),
                                                      want.flatten()[:8].tolist()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("type")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--big", type=int, default=5000, help="elements of the big key")
    ap.add_argument("--cuda", action="store_true", help="every tensor on the GPU")
    args = ap.parse_args()
    if args.cuda:
        torch.set_default_device("cuda")  # values, outputs, and the tensors pull makes

    kv = dtrain.kv.create(args.type)
    n, r, d = kv.num_workers, kv.rank, args.devices
    is_async = "async" in kv.type
    sum_ranks = float(sum(range(1, n + 1)))  # worker w pushes (w + 1) per device

    def per_device(value):
        return [value.clone() for _ in range(d)] if d > 1 else value

    # init: rank 0's value is kept; int and str keys; a list of keys at once.
    kv.init(3, torch.full((2, 3), 10.0 + r))
    kv.init("fc1.weight", torch.full((7,), 20.0 + r))
    kv.init([5, "big"], [torch.zeros(4, 4), torch.arange(args.big, dtype=torch.float32)])
    expect("pull of init int key", kv.pull(3), torch.full((2, 3), 10.0))
    expect("pull of init str key", kv.pull("fc1.weight"), torch.full((7,), 20.0))
    expect("pull of the big key", kv.pull("big"), torch.arange(args.big, dtype=torch.float32))
    out = [torch.empty(2, 3) for _ in range(max(d, 1))]
    kv.pull(3, out=out if d > 1 else out[0]).wait()
    for t in out[:d]:
        expect("pull into out", t, torch.full((2, 3), 10.0))

    kv.barrier()  # async: nobody's pushes may reach a key before everyone has pulled its init

    # push then pull. Sync: the value becomes the round's sum. Async without an optimizer: every
    # push is added to the value.
    kv.push(3, per_device(torch.full((2, 3), float(r + 1))))
    kv.push("big", per_device(torch.full((args.big,), float(r + 1))))
    dtrain.kv.waitall()  # pushes acknowledged are applied; then everyone's are, after the barrier
    kv.barrier()
    if is_async:
        want3 = torch.full((2, 3), 10.0 + d * sum_ranks)
        want_big = torch.arange(args.big, dtype=torch.float32) + d * sum_ranks
    else:
        want3 = torch.full((2, 3), d * sum_ranks)
        want_big = torch.full((args.big,), d * sum_ranks)
    expect("push/pull int key", kv.pull(3), want3)
    expect("push/pull big key", kv.pull("big"), want_big)
    kv.barrier()

    # pushpull: into out, and in place (no out); list forms with one value per key.
    if not is_async:
        res = torch.empty(2, 3)
        h = kv.pushpull(3, torch.full((2, 3), 1.0), out=res)
        h.wait()
        expect("pushpull into out", res, torch.full((2, 3), float(n)))
        vals = [torch.full((7,), 2.0), torch.ones(4, 4)]
        kv.pushpull(["fc1.weight", 5], vals).wait()
        expect("pushpull in place (str key)", vals[0], torch.full((7,), 2.0 * n))
        expect("pushpull in place (int key)", vals[1], torch.full((4, 4), float(n)))
        outs = [torch.empty(7), torch.empty(4, 4)]
        kv.pull(["fc1.weight", 5], out=outs).wait()
        expect("list pull", outs[1], torch.full((4, 4), float(n)))
        kv.barrier()

        # Sparse values (an embedding's gradients, MXNet's row_sparse): summed as their dense
        # forms; row_sparse_pull gives the rows asked for.
        kv.init("emb", torch.zeros(6, 2))
        rows = torch.tensor([[r, 5, 5]])  # row 5 twice: its two entries add up
        kv.push("emb", per_device(torch.sparse_coo_tensor(rows, torch.ones(3, 2) * (r + 1),
                                                          (6, 2))))
        want = torch.zeros(6, 2)
        for w in range(n):
            want[w] += d * (w + 1)
        want[5] = 2 * d * sum_ranks
        got = kv.row_sparse_pull("emb", row_ids=torch.tensor([5, 0, 5]))
        expect("row_sparse_pull rows", got.indices(), torch.tensor([[0, 5]]))
        expect("row_sparse_pull values", got.to_dense(), want * torch.tensor([1., 0, 0, 0, 0, 1])[:, None])
        dense = torch.full((6, 2), -1.0)
        kv.row_sparse_pull("emb", out=dense, row_ids=[1]).wait()
        expect("row_sparse_pull into out", dense, want * torch.tensor([0., 1, 0, 0, 0, 0])[:, None])
        kv.barrier()

    # broadcast: rank 0's value into every worker's out.
    got = torch.empty(3)
    kv.broadcast("bcast", torch.full((3,), 100.0 + r), out=got).wait()
    expect("broadcast", got, torch.full((3,), 100.0))

    # An optimizer on the store: pulls return weights. SGD, lr 0.5, rescale 1/n.
    kv.init(11, torch.ones(6))
    kv.set_optimizer(dtrain.optimizer.create("sgd", learning_rate=0.5, rescale_grad=1.0 / n))
    kv.push(11, per_device(torch.full((6,), float(r + 1))))
    kv.barrier()
    dtrain.kv.waitall()
    w = kv.pull(11)
    if not is_async:
        expect("sgd on the store", w, torch.full((6,), 1.0 - 0.5 * d * sum_ranks / n))

    # Optimizer state: saved, restored (momentum-free SGD has an update count per key).
    kv._barrier()
    fname = os.path.join(tempfile.gettempdir(), "dtrain-kv-opt-%d-%d" % (os.getpid(), r))
    kv.save_optimizer_states(fname)
    kv.load_optimizer_states(fname)
    os.unlink(fname)

    # Misuse is a ValueError naming the key, and loses nothing.
    for call, key in ((lambda: kv.push(3, torch.zeros(5)), "3"),
                      (lambda: kv.pull("never-initialised"), "never-initialised"),
                      (lambda: kv.init(3, torch.zeros(2, 3)), "3")):
        try:
            call()
        except ValueError as e:
            if key not in str(e):
                raise AssertionError("error does not name key %s: %s" % (key, e))
        else:
            raise AssertionError("misuse of key %s was not refused" % key)
    kv.barrier()
    if not is_async:
        expect("value intact after refused calls", kv.pull(3), torch.full((2, 3), float(n)))

    kv.close()
    print("kv_worker OK rank %d of %d (%s)" % (r, n, args.type), flush=True)


if __name__ == "__main__":
    sys.exit(main())
