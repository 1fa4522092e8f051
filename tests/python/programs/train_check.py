"""Exactness of distributed training from Python: N workers, each on its share of every global
batch, must end with the parameters one process reaches on the whole batch (plain PyTorch SGD
with the same momentum and weight decay), to a relative difference of 1e-5.

    train_check.py trainer --kvstore dist_sync [--update-on-worker | --default-update] [--no-fuse]
                           [--devices 2]
                           [--params] [--cuda] [--embedding] [--bfloat16] [--backward-passes 2]
                           [--lr-change]
                                                    # under dtrain launch -n N -s S
    train_check.py hvd [--backward-passes 2] [--fp16]  # under dtrain launch -s 0 or mpirun

--cuda: the model, its replicas and the data on GPU 0 (the replicas share it, standing in for a
worker's GPUs); the reference still runs on the CPU, and the bound is 1e-4 (the GPU's kernels
round differently).

--bfloat16: the model and data in bfloat16 (the Trainer keeps float32 master weights, MXNet's
multi_precision); so does the reference. The bound is 5e-3 for one worker on the host (MXNet's
SGD and torch's round the masters' last bits apart, which may round a weight to a neighbouring
bfloat16), and 2e-2 for several (each worker's gradient of its part of the batch is rounded to
bfloat16, the reference's of the whole batch) or on a GPU (its kernels round otherwise).

--lr-change: every worker calls trainer.set_learning_rate(LR / 10) before step 4, wherever the
optimizer runs (the servers take it from their update of step 4); the reference changes its rate
there too, with MXNet's SGD (whose momentum keeps the velocity taken at the old rate).

--embedding: the model starts with an nn.Embedding whose gradients are sparse (sparse=True, as
PyTorch users train big vocabularies); the reference's is the same embedding with dense gradients.
Where the table travels as rows (a dist store applying the optimizer) the trainer's SGD has
lazy_update=0, MXNet's dense formula (programs/trainer_rows_worker.py checks the lazy one).

Rank 0 prints "train_check max relative difference D" and exits 1 if D is over the bound.
"""

import argparse
import copy
import sys

import torch

import dtrain
import dtrain.torch as hvd

STEPS, GLOBAL_BATCH, LR, MOMENTUM, WD = 6, 48, 0.05, 0.9, 1e-3
LR_CHANGE_AT = 3  # steps done when --lr-change sets LR / 10


class WithEmbedding(torch.nn.Module):
    """Three tokens per sample, read off its features, embedded and added to them."""

    def __init__(self, mlp, sparse):
        super().__init__()
        self.embedding = torch.nn.Embedding(1000, 64, sparse=sparse)  # 256 KiB: its own key
        self.mlp = mlp

    def forward(self, x):
        tokens = (x[:, :3] * 1000).long() % 1000
        return self.mlp(x + self.embedding(tokens).sum(1))


def make_model(embedding=None):
    """embedding: None (none), or whether its gradients are sparse."""
    torch.manual_seed(1)
    # fc1 is big (128 KiB: its own key); the rest are small (fused into one bucket).
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return mlp if embedding is None else WithEmbedding(mlp, sparse=embedding)


def batches():
    g = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        yield torch.randn(GLOBAL_BATCH, 64, generator=g), torch.randint(0, 4, (GLOBAL_BATCH,), generator=g)


def reference_mxnet_sgd(lr_change):
    """One process, the whole batch, MXNet's SGD written out: mom = momentum*mom - lr*(g + wd*w),
    w += mom; the rate LR / 10 from step LR_CHANGE_AT + 1 on if `lr_change`."""
    model = make_model()
    moms = [torch.zeros_like(p) for p in model.parameters()]
    for step, (x, y) in enumerate(batches()):
        lr = LR / 10 if lr_change and step >= LR_CHANGE_AT else LR
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p, m in zip(model.parameters(), moms):
                m.mul_(MOMENTUM).sub_(lr * (p.grad + WD * p))
                p.add_(m)
    return model


def reference(scale=1.0, embedding=False, dtype=torch.float32):
    """One process, the whole batch, mean loss (times `scale`), torch's SGD; for a bfloat16
    model, on float32 master weights that the model gets rounded after each step."""
    model = make_model(False if embedding else None).to(dtype)
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    opt = torch.optim.SGD(masters, lr=LR, momentum=MOMENTUM, weight_decay=WD)
    # bfloat16: the loss summed over the batch, as the workers compute it (the rounding of its
    # gradients is then theirs), and made a mean in float32.
    divide = GLOBAL_BATCH if dtype != torch.float32 else 1
    for x, y in batches():
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(dtype)), y,
                                                 reduction="mean" if divide == 1 else "sum")
        (scale * loss).backward()
        for p, m in zip(model.parameters(), masters):
            m.grad = p.grad.float() / divide
        opt.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), masters):
                p.copy_(m)
    return model


def max_relative_difference(model, ref):
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        p, q = p.detach().cpu().double(), q.detach().double()
        worst = max(worst, ((p - q).abs().max() / q.abs().max()).item())
    return worst


def run_trainer(args):
    kv = dtrain.kv.create(args.kvstore)
    n, r = kv.num_workers, kv.rank
    args.workers = n
    model = make_model(True if args.embedding else None)
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    dtype = torch.bfloat16 if args.bfloat16 else torch.float32
    model.to(device, dtype)
    if r > 0:  # rank 0's initial weights must win: start the others elsewhere
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    replicas = [model] + [copy.deepcopy(model) for _ in range(args.devices - 1)]
    params = model.parameters() if args.params else replicas
    sgd = {"learning_rate": LR, "momentum": MOMENTUM, "wd": WD}
    if args.embedding:  # the dense formula where the table travels as rows (else MXNet's lazy)
        sgd["lazy_update"] = 0
    trainer = dtrain.torch.Trainer(
        params, "sgd", sgd, kvstore=kv,
        update_on_kvstore=None if args.default_update else not args.update_on_worker,
        fuse_below_kb=0 if args.no_fuse else 64, backward_passes_per_step=args.backward_passes)
    print("train_check update_on_kvstore %s" % trainer.update_on_kvstore, flush=True)
    local = GLOBAL_BATCH // n
    for step, (x, y) in enumerate(batches()):
        if args.lr_change and step == LR_CHANGE_AT:
            trainer.set_learning_rate(LR / 10)
            assert abs(trainer.learning_rate - LR / 10) < 1e-12, trainer.learning_rate
        xs, ys = x[r * local:(r + 1) * local].to(dtype), y[r * local:(r + 1) * local]
        on = [device] * args.devices
        k = args.backward_passes  # each pass a k-th of this worker's samples
        for part in range(k):
            s = slice(part * local // k, (part + 1) * local // k)
            parts = dtrain.data.split_and_load(xs[s], on), dtrain.data.split_and_load(ys[s], on)
            for net, xp, yp in zip(replicas, *parts):
                torch.nn.functional.cross_entropy(net(xp), yp, reduction="sum").backward()
        trainer.step(local)
    trainer.wait()
    for rep in replicas[1:]:
        for p, q in zip(rep.parameters(), model.parameters()):
            assert torch.equal(p, q), "local replicas differ"
    return r, model, 1.0


def run_hvd(args):
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    model = make_model()
    if r > 0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,
        backward_passes_per_step=args.backward_passes)
    local = GLOBAL_BATCH // n
    k = args.backward_passes
    for x, y in batches():
        xs, ys = x[r * local:(r + 1) * local], y[r * local:(r + 1) * local]
        opt.zero_grad()
        for part in range(k):
            s = slice(part * local // k, (part + 1) * local // k)
            torch.nn.functional.cross_entropy(model(xs[s]), ys[s]).backward()
        opt.step()
    return r, model, float(k)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["trainer", "hvd"])
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--update-on-worker", action="store_true")
    ap.add_argument("--no-fuse", action="store_true")
    ap.add_argument("--default-update", action="store_true",
                    help="leave update_on_kvstore to the Trainer's default")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--params", action="store_true", help="give the Trainer parameters, not modules")
    ap.add_argument("--backward-passes", type=int, default=1)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--cuda", action="store_true", help="trainer: the model and data on GPU 0")
    ap.add_argument("--bfloat16", action="store_true",
                    help="trainer: the model and data in bfloat16")
    ap.add_argument("--lr-change", action="store_true",
                    help="trainer: set_learning_rate(LR / 10) before step 4")
    ap.add_argument("--embedding", action="store_true",
                    help="trainer: an embedding with sparse gradients first")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, model, scale = run_trainer(args) if args.mode == "trainer" else run_hvd(args)
    if rank != 0:
        return 0
    if args.mode == "trainer" and args.lr_change:
        ref = reference_mxnet_sgd(lr_change=True)
    else:
        ref = reference(scale, args.embedding, torch.bfloat16 if args.bfloat16 else torch.float32)
    diff = max_relative_difference(model, ref)
    if args.bfloat16:  # one worker on the host differs only where its masters' last bits do
        bound = 2e-2 if args.workers > 1 or args.cuda else 5e-3
    else:
        bound = 2e-3 if args.fp16 else 1e-4 if args.cuda else 1e-5
    print("train_check max relative difference %.3g (bound %g)" % (diff, bound), flush=True)
    return 0 if diff < bound else 1


if __name__ == "__main__":
    sys.exit(main())
