"""Distributed training with a Gluon-style Trainer, as the seeds' "Distributed Training using
Gluon" tutorial does it, for PyTorch: a dist_sync KVStore, the data split by worker with
SplitSampler, each worker's batch split over its devices with split_and_load.

    dtrain launch -n 2 -s 2 -- python3 examples/python/gluon_fashion_mnist.py
    python3 examples/python/gluon_fashion_mnist.py --kvstore local      # one process
    dtrain launch -n 2 -s 2 -- python3 examples/python/gluon_fashion_mnist.py --gpus 0,1 \
        --kvstore dist_sync_device                                       # two GPUs a worker

Prints "Epoch N: Test_acc X" per worker after each epoch.
"""

import argparse
import copy
import time

import torch

import dtrain
import dtrain.torch
from fashion_mnist import DEFAULT_DIR, LeNet, accuracy, load


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16, help="per worker and step")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--devices", type=int, default=1, help="local replicas on the CPU")
    ap.add_argument("--gpus", default="", help="replicas on these CUDA devices instead, e.g. 0,1")
    ap.add_argument("--data-dir", default=DEFAULT_DIR)
    ap.add_argument("--log-interval", type=int, default=500, help="batches between lines; 0: none")
    ap.add_argument("--max-batches", type=int, default=0, help="stop each epoch early (tests)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    # Step 1: a distributed key-value store.
    store = dtrain.kv.create(args.kvstore)
    print("Total number of workers: %d" % store.num_workers)
    print("This worker's rank: %d" % store.rank)

    # Step 2: split the training data by worker.
    x, y = load("train", args.data_dir)
    test_x, test_y = load("test", args.data_dir)
    sampler = dtrain.data.SplitSampler(len(x), store.num_workers, store.rank)
    train_data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                             batch_size=args.batch_size, sampler=sampler,
                                             drop_last=True)

    # Step 3: one replica per device; the trainer keeps them, and the workers, in sync.
    torch.manual_seed(0)
    net = LeNet()
    ctx = ([torch.device("cuda", int(i)) for i in args.gpus.split(",")] if args.gpus
           else [torch.device("cpu")] * args.devices)
    nets = [copy.deepcopy(net).to(d) for d in ctx]
    net = nets[0]
    trainer = dtrain.torch.Trainer(nets, "adam", {"learning_rate": args.lr}, kvstore=store)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")  # Gluon's losses sum over the batch

    for epoch in range(args.epochs):
        tic, seen, correct = time.time(), 0, 0
        for i, (data, label) in enumerate(train_data):
            if args.max_batches and i >= args.max_batches:
                break
            parts = dtrain.data.split_and_load(data, ctx), dtrain.data.split_and_load(label, ctx)
            for replica, d, l in zip(nets, *parts):
                out = replica(d)
                loss_fn(out, l).backward()
                correct += (out.argmax(1) == l).sum().item()  # waits for the device
            trainer.step(data.shape[0])
            seen += data.shape[0]
            if args.log_interval and (i + 1) % args.log_interval == 0:
                print("Epoch[%d] Batch [%d-%d] Speed: %.2f samples/sec accuracy=%f"
                      % (epoch, i + 1 - args.log_interval, i + 1, seen / (time.time() - tic),
                         correct / seen), flush=True)
        trainer.wait()
        print("Epoch %d: Test_acc %f" % (epoch, accuracy(net, test_x, test_y)), flush=True)
    trainer.close()
    store.close()


if __name__ == "__main__":
    main()
