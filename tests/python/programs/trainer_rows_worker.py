"""A worker that trains nn.Embedding(sparse=True) and nn.EmbeddingBag(sparse=True) tables with
dtrain.torch.Trainer on a dist_sync store, where they travel as rows, and checks every step's
output and the final weights against a reference kept here: the same model trained in this
process on every worker's batches with MXNet's SGD formulas, lazy on the tables (only the rows
some worker touched move) or, with lazy_update=0, dense. Run under `dtrain launch -n N -s S`
with the lazy flag as its argument; prints "trainer_rows_worker OK rank R" at the end.
"""

import sys

import torch

import dtrain
import dtrain.torch

ROWS, BAG_ROWS, DIM, BATCH, STEPS = 3000, 2000, 16, 8, 5  # tables of 192 and 128 KB: own keys
LR, MOMENTUM, WD = 0.3, 0.9, 0.01


class Model(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.emb = torch.nn.Embedding(ROWS, DIM, sparse=sparse)
        self.bag = torch.nn.EmbeddingBag(BAG_ROWS, DIM, mode="mean", sparse=sparse)
        self.head = torch.nn.Linear(2 * DIM, 1)

    def forward(self, ids, bag_ids):
        return self.head(torch.cat([self.emb(ids), self.bag(bag_ids)], dim=1)).squeeze(1)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, 40, (BATCH,), generator=g) ** 2  # repeats; most rows never touched
    bag_ids = torch.randint(0, BAG_ROWS, (BATCH, 3), generator=g)
    return ids, bag_ids, torch.randn(BATCH, generator=g)


def loss_of(out, y):
    return ((out - y) ** 2).sum()  # a sum over the batch, as the Trainer expects


def reference_step(model, moms, step, workers, lazy):
    """One step of every worker's batch on `model`: MXNet's SGD with momentum, its gradient the
    workers' sum rescaled by 1/(batch x workers); the tables lazily where `lazy`."""
    model.zero_grad()
    touched = {"emb.weight": [], "bag.weight": []}
    for r in range(workers):
        ids, bag_ids, y = batch(r, step)
        loss_of(model(ids, bag_ids), y).backward()
        touched["emb.weight"].append(ids)
        touched["bag.weight"].append(bag_ids.reshape(-1))
    with torch.no_grad():
        for name, w in model.named_parameters():
            g = w.grad / (BATCH * workers) + WD * w
            rows = torch.unique(torch.cat(touched[name])) if lazy and name in touched else None
            if rows is None:
                moms[name].mul_(MOMENTUM).sub_(LR * g)
                w.add_(moms[name])
            else:
                moms[name][rows] = MOMENTUM * moms[name][rows] - LR * g[rows]
                w[rows] += moms[name][rows]


def main():
    lazy = int(sys.argv[1])
    kv = dtrain.kv.create("dist_sync")
    torch.manual_seed(5)
    net = Model(sparse=True)
    reference = Model(sparse=False)
    reference.load_state_dict(net.state_dict())
    moms = {n: torch.zeros_like(p) for n, p in reference.named_parameters()}
    trainer = dtrain.torch.Trainer(
        net, "sgd", {"learning_rate": LR, "momentum": MOMENTUM, "wd": WD, "lazy_update": lazy},
        kvstore=kv)
    for step in range(STEPS):
        ids, bag_ids, y = batch(kv.rank, step)
        out = net(ids, bag_ids)  # the tables' rows pulled before their forward
        with torch.no_grad():
            want = reference(ids, bag_ids)
        if not torch.allclose(out, want, rtol=1e-5, atol=1e-6):
            raise AssertionError("step %d: output %s, the reference's %s" % (step, out, want))
        loss_of(out, y).backward()
        assert net.emb.weight.grad.is_sparse
        trainer.step(BATCH)
        reference_step(reference, moms, step, kv.num_workers, lazy)
    trainer.wait()  # the whole tables, for this check
    for (name, got), want in zip(net.named_parameters(), reference.parameters()):
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            raise AssertionError("%s differs from the reference by %g" % (
                name, float((got - want).abs().max())))
    never = torch.ones(ROWS, dtype=torch.bool)
    never[torch.arange(40) ** 2] = False
    torch.manual_seed(5)
    initial = Model(sparse=False)
    moved = not torch.equal(net.emb.weight[never], initial.emb.weight[never])
    if moved != (not lazy):
        raise AssertionError("rows no batch touched %s" % ("moved" if moved else "stayed"))
    rank = kv.rank
    trainer.close()
    kv.close()
    print("trainer_rows_worker OK rank %d" % rank, flush=True)


if __name__ == "__main__":
    main()
