"""Horovod's SyncBatchNorm: batch normalization whose statistics are those of the whole batch,
every rank's samples together, as if one process had seen them all.

In training, each rank sums its samples (shifted by the running mean, which every rank holds
alike, so that the variance does not suffer from cancellation) and their squares; one allreduce
adds every rank's sums and sample counts, from which come the batch mean and variance. The
allreduce is differentiable (autograd.py: its gradient is the sum of every rank's), so backward
gives each rank the gradient of the sum of all ranks' losses through the statistics, which is
what torch's SyncBatchNorm computes. Ranks may have different batch sizes. In evaluation, or with
one rank, it is torch's BatchNorm.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .autograd import allreduce
from .ops import Sum, is_initialized
from .process_sets import _set_id, _set_size

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Applies batch normalization over (N, C, ...) inputs with statistics synchronized across
    the ranks (of `process_set`, all by default). Arguments as torch.nn.BatchNorm*d."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def _run_bn(self, input: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats,
                            self._momentum(), self.eps)

    def _momentum(self) -> float:
        if self.momentum is not None:
            return self.momentum
        tracked = self.num_batches_tracked
        if tracked is None:  # no running statistics to average into
            return 0.0
        return 1.0 / float(tracked)  # a cumulative moving average

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)  # type: ignore[union-attr, unused-ignore]
        if (not self.training and self.track_running_stats) or not is_initialized() or \
                _set_size(_set_id(self.process_set)) == 1:
            return self._run_bn(input)
        return self._sync_bn(input)

    def _sync_bn(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        xc = x.to(compute)
        shift = (self.running_mean.detach().to(compute) if self.running_mean is not None
                 else torch.zeros(channels, dtype=compute, device=x.device))
        shape = [1, channels] + [1] * (x.dim() - 2)
        centered = xc - shift.view(shape)
        count = torch.tensor([x.numel() // channels], dtype=compute, device=x.device)
        local = torch.cat([centered.sum(dims), (centered * centered).sum(dims), count])
        total = allreduce(local, op=Sum, process_set=self.process_set)
        n = total[-1].detach()
        if float(n) < 2:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel when training "
                             "(got %d over all ranks)" % int(float(n)))
        mean_shifted = total[:channels] / n
        var = (total[channels:2 * channels] / n - mean_shifted * mean_shifted).clamp(min=0)
        mean = mean_shifted + shift
        if self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                m = self._momentum()
                self.running_mean.mul_(1 - m).add_(mean.detach() * m)
                self.running_var.mul_(1 - m).add_(var.detach() * (n / (n - 1)) * m)
        y = (xc - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.weight is not None and self.bias is not None:
            y = y * self.weight.to(compute).view(shape) + self.bias.to(compute).view(shape)
        return y.to(x.dtype)
