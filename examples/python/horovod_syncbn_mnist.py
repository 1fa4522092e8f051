"""Horovod's PyTorch training with SyncBatchNorm and Max/Min-reduced metrics, on dtrain: only the
import line differs from a Horovod script.

    dtrain launch -n 2 -s 0 -- python3 examples/python/horovod_syncbn_mnist.py   # Gloo
    mpirun -np 2 python3 examples/python/horovod_syncbn_mnist.py                 # OpenMPI

A small convolutional network whose batch normalization layers are hvd.SyncBatchNorm (their
statistics are those of every rank's batch together), trained on Fashion-MNIST. After each epoch
rank 0 prints the test accuracy averaged over the ranks' shares of the test set and the best and
worst share (allreduce with op=hvd.Max and hvd.Min), as metrics code does:
"Epoch N: Test_acc X (shares from A to B)".
"""

import argparse

import torch
import torch.nn.functional as F

import dtrain.torch as hvd
from fashion_mnist import DEFAULT_DIR, load


class BnNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5)
        self.bn1 = hvd.SyncBatchNorm(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 5)
        self.bn2 = hvd.SyncBatchNorm(32)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data-dir", default=DEFAULT_DIR)
    ap.add_argument("--max-batches", type=int, default=0, help="stop each epoch early (tests)")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x, y = load("train", args.data_dir)
    test_x, test_y = load("test", args.data_dir)
    train_dataset = torch.utils.data.TensorDataset(x, y)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    # This rank's share of the test set.
    mine = slice(hvd.rank(), None, hvd.size())
    test_x, test_y = test_x[mine], test_y[mine]

    model = BnNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        for i, (data, target) in enumerate(train_loader):
            if args.max_batches and i >= args.max_batches:
                break
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()

        model.eval()
        with torch.no_grad():
            correct = sum((model(test_x[k:k + 1000]).argmax(1) == test_y[k:k + 1000]).sum().item()
                          for k in range(0, len(test_x), 1000))
        share = torch.tensor(correct / len(test_x))
        average = hvd.allreduce(share, name="acc.avg").item()
        best = hvd.allreduce(share, name="acc.max", op=hvd.Max).item()
        worst = hvd.allreduce(share, name="acc.min", op=hvd.Min).item()
        if hvd.rank() == 0:
            print("Epoch %d: Test_acc %f (shares from %f to %f)" % (epoch, average, worst, best),
                  flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
