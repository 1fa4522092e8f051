"""Fashion-MNIST from Debian's dataset-fashion-mnist package, read with plain Python (gzip and
numpy; nothing is downloaded). MNIST's files have the same format: pass their folder."""

import gzip
import os
import struct

import numpy as np
import torch

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An idx file (.gz) as a numpy array: big-endian magic (0, 0, dtype 0x08, dims), sizes,
    then the data."""
    with gzip.open(path, "rb") as f:
        zero, dtype, dims = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype != 0x08 or not 1 <= dims <= 3:
            raise ValueError("%s is not an idx file of unsigned bytes" % path)
        shape = struct.unpack(">" + "I" * dims, f.read(4 * dims))
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if data.size != int(np.prod(shape)):
        raise ValueError("%s holds %d bytes, its header says %s" % (path, data.size, shape))
    return data.reshape(shape)


def load(split, data_dir=DEFAULT_DIR):
    """(images as float32 N x 1 x 28 x 28 in [0, 1], labels as int64) of 'train' or 'test'."""
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


class LeNet(torch.nn.Module):
    """LeNet-5 with ReLU, as dtrain-train's "lenet"."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


def accuracy(net, x, y, batch=1000):
    device = next(net.parameters()).device  # the data go where the network is
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = net(x[i:i + batch].to(device)).cpu()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    net.train()
    return correct / len(x)
