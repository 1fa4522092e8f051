#!/usr/bin/env python3
"""The PyTorch references for dtrain-train on a GPU (bench/gpu_train_bench.py runs both sides).

dtrain's own ResNet-18 (src/train/models/resnet.cc: the CIFAR variant, 3x3 stem, no max-pool),
written again in PyTorch layer for layer, trained on CIFAR-shaped random images held on the host
(a batch is gathered and copied to the GPU each step, as dtrain-train does), SGD with momentum:

    python3 bench/gpu_train.py plain                # one process, no communication
    python3 bench/gpu_train.py ddp --workers 2      # DistributedDataParallel over gloo, CUDA tensors

Every process uses GPU 0 (--gpu): on a one-GPU machine the DDP processes share it, as the dtrain
workers they are compared with do. Timing as dtrain-train's progress lines: windows of
--log-interval steps, each ended by reading the window's loss (which waits for the GPU); a
process's speed is the median window after the first (warm-up). Prints one JSON line:
{"mode", "workers", "samples_per_s" (summed over processes), "per_process", "gpu"}.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def conv(cin, cout, kernel, stride):
    c = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
    nn.init.kaiming_normal_(c.weight, mode="fan_out", nonlinearity="relu")
    return c


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = conv(cin, cout, 3, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv(cout, cout, 3, 1), nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet18(nn.Module):
    def __init__(self, channels=3, classes=10):
        super().__init__()
        self.conv1, self.bn1 = conv(channels, 64, 3, 1), nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def train(rank, args, queue):
    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    if args.mode == "ddp":
        dist.init_process_group("gloo", rank=rank, world_size=args.workers,
                                timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(args.seed + rank)
    images = torch.randn(args.samples, 3, 32, 32)
    labels = torch.randint(0, 10, (args.samples,))
    model = ResNet18().to(device)
    net = model
    if args.mode == "ddp":
        net = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    speeds, window_loss, start = [], None, time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, args.samples, (args.batch_size,))
        x = images.index_select(0, idx).to(device)
        y = labels.index_select(0, idx).to(device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        window_loss = loss.detach() if window_loss is None else window_loss + loss.detach()
        if (step + 1) % args.log_interval == 0:
            window_loss.item()  # waits for the window's GPU work, as dtrain-train's line does
            now = time.perf_counter()
            speeds.append(args.log_interval * args.batch_size / (now - start))
            start, window_loss = now, None
    measured = speeds[1:] or speeds
    result = statistics.median(measured) if measured else 0.0
    if args.mode == "ddp":
        gathered = [None] * args.workers
        dist.all_gather_object(gathered, result)
        if rank == 0:
            queue.put(gathered)
    else:
        queue.put([result])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["plain", "ddp"])
    p.add_argument("--workers", type=int, default=2, help="DDP processes")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--samples", type=int, default=10000, help="images held on the host")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=300, help="seconds before giving up")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_train: torch sees no CUDA device")
    workers = args.workers if args.mode == "ddp" else 1
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    if args.mode == "ddp":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs = [ctx.Process(target=train, args=(r, args, queue)) for r in range(workers)]
        for proc in procs:
            proc.start()
    else:
        procs = [ctx.Process(target=train, args=(0, args, queue))]
        procs[0].start()
    try:
        speeds = queue.get(timeout=args.timeout)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    print(json.dumps({"mode": args.mode, "workers": workers, "batch_size": args.batch_size,
                      "samples_per_s": round(sum(speeds), 1),
                      "per_process": [round(s, 1) for s in speeds],
                      "gpu": torch.cuda.get_device_name(args.gpu)}), flush=True)


if __name__ == "__main__":
    main()
