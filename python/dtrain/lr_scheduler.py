"""MXNet's learning-rate schedulers, run by the core's optimizers (on the servers with
update_on_kvstore). Pass one as ``lr_scheduler=`` to :func:`dtrain.optimizer.create`; as in
MXNet, the optimizer's ``learning_rate`` becomes the schedule's base rate.

- ``FactorScheduler(step, factor=1, stop_factor_lr=1e-8, warmup_steps=0, warmup_begin_lr=0)``:
  the rate is multiplied by `factor` each time the update count passes a multiple of `step`.
- ``CosineScheduler(max_update, final_lr=0, warmup_steps=0, warmup_begin_lr=0)``: cosine decay
  from the base rate to `final_lr` over `max_update` updates.

Update counts are per parameter (MXNet's ``num_update``), starting at 1.
"""

from __future__ import annotations

__all__ = ["LRScheduler", "FactorScheduler", "CosineScheduler"]


class LRScheduler:
    """Base class: a schedule name and its parameters as the core reads them."""

    kind = ""

    def __init__(self, base_lr: float = 0.01, warmup_steps: int = 0,
                 warmup_begin_lr: float = 0) -> None:
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.warmup_begin_lr = warmup_begin_lr

    def _params(self) -> dict[str, float]:
        return {"lr_warmup_steps": self.warmup_steps, "lr_warmup_begin": self.warmup_begin_lr}


class FactorScheduler(LRScheduler):
    kind = "step"

    def __init__(self, step: int, factor: float = 1, stop_factor_lr: float = 1e-8,
                 base_lr: float = 0.01, warmup_steps: int = 0, warmup_begin_lr: float = 0) -> None:
        super().__init__(base_lr, warmup_steps, warmup_begin_lr)
        self.step = step
        self.factor = factor
        self.stop_factor_lr = stop_factor_lr

    def _params(self) -> dict[str, float]:
        p = super()._params()
        p.update(lr_step=self.step, lr_factor=self.factor, lr_stop_factor_lr=self.stop_factor_lr)
        return p


class CosineScheduler(LRScheduler):
    kind = "cosine"

    def __init__(self, max_update: int, base_lr: float = 0.01, final_lr: float = 0,
                 warmup_steps: int = 0, warmup_begin_lr: float = 0) -> None:
        super().__init__(base_lr, warmup_steps, warmup_begin_lr)
        self.max_update = max_update
        self.final_lr = final_lr

    def _params(self) -> dict[str, float]:
        p = super()._params()
        p.update(lr_max_update=self.max_update, lr_final=self.final_lr)
        return p
