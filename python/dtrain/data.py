"""Splitting data over workers and over a worker's devices, as MXNet's examples do.

    sampler = dtrain.data.SplitSampler(len(dataset), kv.num_workers, kv.rank)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)       # optional: iterating also moves to the next epoch
        for data, label in loader:
            parts = dtrain.data.split_and_load(data, devices)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import _dtrain
from .errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from typing import TypeAlias

    # Devices (or their names, e.g. 'cuda:0'), or a number of CPU replicas.
    _Devices: TypeAlias = int | Iterable[torch.device | str | int]

__all__ = ["SplitSampler", "split_and_load", "split_data"]


class SplitSampler(torch.utils.data.Sampler):
    """Worker `part_index` of `num_parts` gets the contiguous range ``[part_index * L,
    (part_index + 1) * L)`` with ``L = length // num_parts`` (the remainder is dropped, so every
    worker runs the same number of steps), shuffled every epoch from (seed, epoch): the same
    order on every run. ``shuffle=False`` keeps the range in order."""

    def __init__(self, length: int, num_parts: int = 1, part_index: int = 0, seed: int = 0,
                 shuffle: bool = True) -> None:
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

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for `epoch` at the next iteration (as torch's DistributedSampler)."""
        self.epoch = epoch
        self._explicit_epoch = True

    def __iter__(self) -> Iterator[int]:
        indices = _dtrain.split_sampler_indices(self.length, self.num_parts, self.part_index,
                                                self.seed, self.shuffle, self.epoch)
        if not self._explicit_epoch:
            self.epoch += 1
        self._explicit_epoch = False
        return iter(indices)

    def __len__(self) -> int:
        return self._part_len


def _devices(ctx_list: _Devices) -> list[torch.device]:
    if isinstance(ctx_list, int):
        if ctx_list < 1:
            raise InvalidArgument("split over %d devices: give at least one" % ctx_list)
        return [torch.device("cpu")] * ctx_list
    devices = [torch.device(c) if not isinstance(c, torch.device) else c for c in ctx_list]
    if not devices:
        raise InvalidArgument("split over an empty list of devices: give at least one")
    return devices


def split_data(data: torch.Tensor, num_slice: int, batch_axis: int = 0, even_split: bool = True,
               work_load_list: Sequence[float] | None = None) -> list[torch.Tensor]:
    """`data` cut into `num_slice` parts along `batch_axis` (MXNet's gluon.utils.split_data).
    With even_split the size must divide evenly; with `work_load_list` parts follow the weights."""
    if num_slice < 1:
        raise InvalidArgument("split into %d slices: give at least one" % num_slice)
    size = data.shape[batch_axis]
    if even_split and work_load_list is None and size % num_slice != 0:
        raise ValueError("data with shape %s cannot be split evenly into %d slices along axis %d; "
                         "use even_split=False" % (tuple(data.shape), num_slice, batch_axis))
    slices = _dtrain.split_batch(size, num_slice, list(work_load_list or []))
    return [data.narrow(batch_axis, offset, length) for offset, length in slices]


def split_and_load(data: torch.Tensor, ctx_list: _Devices, batch_axis: int = 0,
                   even_split: bool = True,
                   work_load_list: Sequence[float] | None = None) -> list[torch.Tensor]:
    """`data` split over the devices of `ctx_list` (a list of torch devices or device names, or a
    number of CPU replicas) and moved to each (MXNet's gluon.utils.split_and_load)."""
    devices = _devices(ctx_list)
    if len(devices) == 1:
        return [data.to(devices[0])]
    parts = split_data(data, len(devices), batch_axis, even_split, work_load_list)
    return [p.to(d) for p, d in zip(parts, devices)]
