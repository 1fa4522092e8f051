"""Horovod's PyTorch MNIST example on dtrain: only the import line differs from Horovod's.

    mpirun -np 2 python3 examples/python/horovod_mnist.py                # OpenMPI
    dtrain launch -n 2 -s 0 -- python3 examples/python/horovod_mnist.py  # Gloo, no MPI

Trains LeNet on Fashion-MNIST (Debian's dataset-fashion-mnist; --data-dir for MNIST) with SGD,
the learning rate scaled by the number of ranks, and prints "Epoch N: Test_acc X" on rank 0.
"""

import argparse
import time

import torch

import dtrain.torch as hvd
from fashion_mnist import DEFAULT_DIR, LeNet, load


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--fp16-allreduce", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data-dir", default=DEFAULT_DIR)
    ap.add_argument("--log-interval", type=int, default=200, help="batches between lines; 0: none")
    ap.add_argument("--gpus", action="store_true",
                    help="each rank trains on a GPU (its local rank's, as Horovod's examples)")
    ap.add_argument("--max-batches", type=int, default=0, help="stop each epoch early (tests)")
    args = ap.parse_args()

    # Horovod: initialize, one thread per process.
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = load("train", args.data_dir)
    test_x, test_y = load("test", args.data_dir)
    train_dataset = torch.utils.data.TensorDataset(x, y)
    test_dataset = torch.utils.data.TensorDataset(test_x, test_y)
    # Horovod: each rank reads its own part of the data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000, sampler=test_sampler)

    device = torch.device("cpu")
    if args.gpus:
        # Horovod: pin one GPU per process.
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = LeNet().to(device)
    # Horovod: scale the learning rate by the number of ranks.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    # Horovod: every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod: wrap the optimizer; gradients are averaged as backward produces them.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        tic, seen, correct = time.time(), 0, 0
        for i, (data, target) in enumerate(train_loader):
            if args.max_batches and i >= args.max_batches:
                break
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = torch.nn.functional.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            seen += len(data)
            correct += (output.argmax(1) == target).sum().item()
            if args.log_interval and (i + 1) % args.log_interval == 0:
                print("Epoch[%d] Batch [%d-%d] Speed: %.2f samples/sec accuracy=%f"
                      % (epoch, i + 1 - args.log_interval, i + 1, seen / (time.time() - tic),
                         correct / seen), flush=True)

        model.eval()
        test_correct, test_seen = 0, 0
        with torch.no_grad():
            for data, target in test_loader:
                test_correct += (model(data.to(device)).argmax(1).cpu() == target).sum().item()
                test_seen += len(data)
        # Horovod: average the metric over the ranks.
        acc = metric_average(test_correct / test_seen, "test_accuracy")
        if hvd.rank() == 0:
            print("Epoch %d: Test_acc %f" % (epoch, acc), flush=True)


if __name__ == "__main__":
    main()
