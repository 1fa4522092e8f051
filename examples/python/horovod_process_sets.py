"""Horovod's process sets on dtrain: two models trained at the same time by two halves of the job.

    dtrain launch -n 2 -s 0 -- python3 examples/python/horovod_process_sets.py   # Gloo
    mpirun -np 4 python3 examples/python/horovod_process_sets.py                 # OpenMPI

The even ranks train LeNet, the odd ranks a small MLP, each on Fashion-MNIST split among its own
set's ranks: every gradient allreduce runs within a set (hvd.DistributedOptimizer(...,
process_set=)), and the two sets' collectives run concurrently. At the end the whole job compares
the two models: rank 0 prints "Model lenet: Test_acc X" and "Model mlp: Test_acc Y" from an
allgather_object over every rank.
"""

import argparse

import torch
import torch.nn.functional as F

import dtrain.torch as hvd
from fashion_mnist import DEFAULT_DIR, LeNet, load


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--data-dir", default=DEFAULT_DIR)
    ap.add_argument("--max-batches", type=int, default=0, help="stop each epoch early (tests)")
    args = ap.parse_args()

    hvd.init()
    if hvd.size() < 2:
        raise SystemExit("run with at least 2 ranks: one set for each model")
    even = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 0])
    odd = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 1])
    my_set = even if even.included() else odd
    name = "lenet" if my_set is even else "mlp"
    torch.manual_seed(42)
    torch.set_num_threads(1)

    x, y = load("train", args.data_dir)
    test_x, test_y = load("test", args.data_dir)
    # This set's ranks split the training data among themselves.
    x, y = x[my_set.rank()::my_set.size()], y[my_set.rank()::my_set.size()]
    model = LeNet() if name == "lenet" else torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * my_set.size(), momentum=0.9)
    root = my_set.ranks[0]
    for key, value in model.state_dict().items():
        hvd.broadcast_(value, root_rank=root, name="init." + key, process_set=my_set)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         process_set=my_set)

    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for i in range(len(x) // args.batch_size):
            if args.max_batches and i >= args.max_batches:
                break
            batch = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()

    model.eval()
    with torch.no_grad():
        acc = sum((model(test_x[k:k + 1000]).argmax(1) == test_y[k:k + 1000]).sum().item()
                  for k in range(0, len(test_x), 1000)) / len(test_x)
    results = hvd.allgather_object((name, acc))  # the whole job
    if hvd.rank() == 0:
        for model_name in ("lenet", "mlp"):
            accs = [a for n, a in results if n == model_name]
            # The ranks of a set hold the same model.
            assert max(accs) - min(accs) < 1e-9, results
            print("Model %s: Test_acc %f" % (model_name, accs[0]), flush=True)
    hvd.remove_process_set(odd)
    hvd.remove_process_set(even)
    hvd.shutdown()


if __name__ == "__main__":
    main()
