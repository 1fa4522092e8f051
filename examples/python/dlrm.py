"""A DLRM-style click model trained on a parameter server: several embedding tables (the biggest
over 1 GB by default) that live on the servers (dtrain.torch.ServerEmbedding: a worker holds only
its batch's rows), dense features through a bottom MLP, DLRM's dot interactions, a top MLP, and
synthetic click data with power-law ids (as DLRM's synthetic generator; here the labels come from
a hidden model, so that there is something to learn). Each worker reads its own share of the
samples; every parameter's optimizer (AdaGrad, as DLRM's sparse tables use) runs on the servers.

    dtrain launch -n 2 -s 2 -- python3 examples/python/dlrm.py
    dtrain launch -n 2 -s 2 -- python3 examples/python/dlrm.py --tables 100000,10000 --steps 200

Rank 0 prints "Step N: loss X" now and then and "Test_auc A Test_acc B" at the end, on held-out
samples.
"""

import argparse
import math
import time

import torch

import dtrain
import dtrain.torch

DENSE = 13  # dense features, as Criteo's


class HiddenModel:
    """The clicks' ground truth: a score per row of every table and a dense direction."""

    def __init__(self, tables, seed):
        gen = torch.Generator().manual_seed(seed)
        self.scores = [torch.randn(rows, generator=gen) for rows in tables]
        self.dense = torch.randn(DENSE, generator=gen) * 0.5

    def samples(self, n, tables, seed):
        """n samples: dense features, one power-law id per table (P(id) ~ 1/(id+1)), labels."""
        gen = torch.Generator().manual_seed(seed)
        dense = torch.randn(n, DENSE, generator=gen)
        ids = []
        for rows in tables:
            u = torch.rand(n, generator=gen)
            ids.append((torch.exp(u * math.log(rows)) - 1).long().clamp_(0, rows - 1))
        logit = dense @ self.dense + sum(s[i] for s, i in zip(self.scores, ids)) - 0.5
        labels = torch.bernoulli(torch.sigmoid(logit), generator=gen)
        return dense, torch.stack(ids, dim=1), labels


def mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])  # the last layer is linear


def server_tables(kv):
    """Tables on the servers: table t is ServerEmbedding "table<t>"."""
    return lambda t, rows, dim: dtrain.torch.ServerEmbedding(rows, dim, kv, name="table%d" % t,
                                                             seed=1000 * t)


class DLRM(torch.nn.Module):
    """make_table(t, rows, dim): table t's module (bench/sparse_bench.py gives nn.Embeddings)."""

    def __init__(self, tables, dim, make_table):
        super().__init__()
        self.bottom = mlp([DENSE, 64, dim])
        self.tables = torch.nn.ModuleList(make_table(t, rows, dim)
                                          for t, rows in enumerate(tables))
        features = 1 + len(tables)
        self.top = mlp([dim + features * (features - 1) // 2, 64, 1])

    def forward(self, dense, ids):
        x = self.bottom(dense)
        vectors = torch.stack([x] + [t(ids[:, i]) for i, t in enumerate(self.tables)], dim=1)
        dots = vectors @ vectors.transpose(1, 2)  # DLRM's dot interactions
        i, j = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def auc(scores, labels):
    """The area under the ROC curve (ties averaged)."""
    ranks = torch.empty_like(scores)
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    positives = labels.sum()
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2)
                 / (positives * negatives))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tables", default="4200000,100000,10000",
                    help="rows per table (the first: 4.2M x 64 float32, 1.07 GB)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512, help="samples per worker per step")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--test-samples", type=int, default=20000)
    args = ap.parse_args()
    tables = [int(t) for t in args.tables.split(",")]
    torch.manual_seed(0)  # the same MLP weights on every worker (rank 0's are kept anyway)

    kv = dtrain.kv.create("dist_sync")
    model = DLRM(tables, args.dim, server_tables(kv))
    dense_params = [(name, p) for name, p in model.named_parameters()]
    kv.init([name for name, _ in dense_params], [p.detach() for _, p in dense_params])
    # One optimizer on the servers for every key: the MLPs' and the tables' rows (lazily).
    kv.set_optimizer(dtrain.optimizer.create(
        "adagrad", learning_rate=args.lr, rescale_grad=1.0 / (args.batch * kv.num_workers)))
    truth = HiddenModel(tables, seed=7)
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")  # sums, as the rescale expects

    start = time.perf_counter()
    for step in range(args.steps):
        dense, ids, labels = truth.samples(args.batch, tables, seed=1 + step * kv.num_workers
                                           + kv.rank)  # this worker's share
        loss = loss_fn(model(dense, ids), labels)
        loss.backward()  # the tables' rows go to the servers here
        for name, p in dense_params:
            kv.push(name, p.grad)
            p.grad = None
        pulls = [kv.pull(name, out=p.data) for name, p in dense_params]
        for h in pulls:  # the next forward must read the new weights, not a half-written pull
            h.wait()
        if kv.rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            print("Step %d: loss %.4f (%.1f samples/s a worker)"
                  % (step, loss.item() / args.batch,
                     (step + 1) * args.batch / (time.perf_counter() - start)), flush=True)

    with torch.no_grad():
        dense, ids, labels = truth.samples(args.test_samples, tables, seed=10**9)
        scores = torch.cat([model(dense[k:k + 4096], ids[k:k + 4096])
                            for k in range(0, args.test_samples, 4096)])
    if kv.rank == 0:
        accuracy = float(((scores > 0).float() == labels).float().mean())
        print("Test_auc %.4f Test_acc %.4f (%d held-out samples; the hidden model's own AUC %.4f)"
              % (auc(scores, labels), accuracy, args.test_samples,
                 auc(dense @ truth.dense + sum(s[i] for s, i in
                                              zip(truth.scores, ids.unbind(1))), labels)),
              flush=True)
    kv.close()


if __name__ == "__main__":
    main()
