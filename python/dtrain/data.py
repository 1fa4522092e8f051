"""Splitting data over workers and over a worker's devices, as MXNet's examples do.

    sampler = dtrain.data.SplitSampler(len(dataset), kv.num_workers, kv.rank)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)       # optional: iterating also moves to the next epoch
        for data, label in loader:
            parts = dtrain.data.split_and_load(data, devices)
"""

import torch

from . import _dtrain

__all__ = ["SplitSampler", "split_and_load", "split_data"]


class SplitSampler(torch.utils.data.Sampler):
    """Worker `part_index` of `num_parts` gets the contiguous range ``[part_index * L,
    (part_index + 1) * L)`` with ``L = length // num_parts`` (the remainder is dropped, so every
    worker runs the same number of steps), shuffled every epoch from (seed, epoch): the same
    order on every run. ``shuffle=False`` keeps the range in order."""

    def __init__(self, length, num_parts=1, part_index=0, seed=0, shuffle=True):
        self.length = length
        self.num_parts = num_parts
        self.part_index = part_index
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self._explicit_epoch = False
        # Checks the arguments now (InvalidArgument naming the bad one).
        self._part_len = len(_dtrain.split_sampler_indices(length, num_parts, part_index, seed,
                                                           False, 0))

    def set_epoch(self, epoch):
        """Shuffle for `epoch` at the next iteration (as torch's DistributedSampler)."""
        self.epoch = epoch
        self._explicit_epoch = True

    def __iter__(self):
        indices = _dtrain.split_sampler_indices(self.length, self.num_parts, self.part_index,
                                                self.seed, self.shuffle, self.epoch)
        if not self._explicit_epoch:
            self.epoch += 1
        self._explicit_epoch = False
        return iter(indices)

    def __len__(self):
        return self._part_len


def _devices(ctx_list):
    if isinstance(ctx_list, int):
        return [torch.device("cpu")] * ctx_list
    return [torch.device(c) if not isinstance(c, torch.device) else c for c in ctx_list]


def split_data(data, num_slice, batch_axis=0, even_split=True, work_load_list=None):
    """`data` cut into `num_slice` parts along `batch_axis` (MXNet's gluon.utils.split_data).
    With even_split the size must divide evenly; with `work_load_list` parts follow the weights."""
    size = data.shape[batch_axis]
    if even_split and work_load_list is None and size % num_slice != 0:
        raise ValueError("data with shape %s cannot be split evenly into %d slices along axis %d; "
                         "use even_split=False" % (tuple(data.shape), num_slice, batch_axis))
    slices = _dtrain.split_batch(size, num_slice, list(work_load_list or []))
    return [data.narrow(batch_axis, offset, length) for offset, length in slices]


def split_and_load(data, ctx_list, batch_axis=0, even_split=True, work_load_list=None):
    """`data` split over the devices of `ctx_list` (a list of torch devices or device names, or a
    number of CPU replicas) and moved to each (MXNet's gluon.utils.split_and_load)."""
    devices = _devices(ctx_list)
    if len(devices) == 1:
        return [data.to(devices[0])]
    parts = split_data(data, len(devices), batch_axis, even_split, work_load_list)
    return [p.to(d) for p, d in zip(parts, devices)]
