"""Horovod's elastic PyTorch example on dtrain: training that goes on when workers die or join.

    dtrain launch -s 0 --host-discovery-script ./hosts.sh --min-np 2 --max-np 3 -- \\
        python3 examples/python/horovod_elastic_mnist.py

hosts.sh prints the slots that may run workers, e.g. `echo localhost:3`. Trains LeNet on
Fashion-MNIST (Debian's dataset-fashion-mnist) with SGD, the learning rate scaled by the current
number of ranks, commits its state every --batches-per-commit batches, and prints
"Epoch N: Test_acc X" on rank 0. Kill a worker: the others roll back to the last commit and go
on; print one more slot from hosts.sh: a new worker joins at the next commit.
"""

import argparse
import time

import torch

import dtrain.torch as hvd
from fashion_mnist import DEFAULT_DIR, LeNet, load


def evaluate(model, dataset):
    """Test accuracy over the whole test set, each rank scoring its share."""
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1000, sampler=sampler)
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for data, target in loader:
            correct += (model(data).argmax(1) == target).sum().item()
            seen += len(data)
    model.train()
    totals = hvd.allreduce(torch.tensor([correct, seen], dtype=torch.float64), op=hvd.Sum,
                           name="test_accuracy")
    return (totals[0] / totals[1]).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--batches-per-commit", type=int, default=50)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data-dir", default=DEFAULT_DIR)
    ap.add_argument("--log-interval", type=int, default=200)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = load("train", args.data_dir)
    test_x, test_y = load("test", args.data_dir)
    train_dataset = torch.utils.data.TensorDataset(x, y)
    test_dataset = torch.utils.data.TensorDataset(test_x, test_y)
    # Horovod: the elastic sampler re-splits what the epoch has left whenever the ranks change.
    train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)

    model = LeNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0,
                                   batch=0)

    def on_reset():
        # Horovod: the learning rate follows the number of ranks.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print("Reset: %d rank(s) from epoch %d, batch %d" % (hvd.size(), state.epoch,
                                                                 state.batch), flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                                 sampler=state.train_sampler)
            tic, seen = time.time(), 0
            for i, (data, target) in enumerate(loader):
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(data), target)
                loss.backward()
                optimizer.step()
                state.train_sampler.record_batch(i, args.batch_size)
                state.batch += 1
                seen += len(data)
                if state.batch % args.log_interval == 0 and hvd.rank() == 0:
                    print("Epoch[%d] Batch %d: %d rank(s), %.2f samples/sec per rank"
                          % (state.epoch, state.batch, hvd.size(), seen / (time.time() - tic)),
                          flush=True)
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            acc = evaluate(model, test_dataset)
            if hvd.rank() == 0:
                print("Epoch %d: Test_acc %f" % (state.epoch, acc), flush=True)
            state.epoch += 1
            state.batch = 0
            state.train_sampler.set_epoch(state.epoch)
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
