"""MXNet's optimizers by name, run by the C++ core: on the servers when a KVStore or Trainer
updates on the kvstore, on the worker otherwise, with identical results.

    opt = dtrain.optimizer.create('sgd', learning_rate=0.1, momentum=0.9, wd=1e-4)
    kv.set_optimizer(opt)

Names and parameters (MXNet's):

- ``sgd``: learning_rate (0.01), momentum (0), wd (0), rescale_grad (1), clip_gradient,
  nesterov (False)
- ``nag``: SGD with Nesterov momentum: learning_rate, momentum, wd, rescale_grad, clip_gradient
- ``adam``: learning_rate (0.001), beta1 (0.9), beta2 (0.999), epsilon (1e-8), wd,
  rescale_grad, clip_gradient
- ``adagrad``: learning_rate (0.01), eps or epsilon (1e-7), wd, rescale_grad, clip_gradient
- ``rmsprop``: learning_rate (0.001), gamma1 (0.9), gamma2 (0.9), epsilon (1e-8), centered
  (False), clip_weights, wd, rescale_grad, clip_gradient

Every one takes ``lr_scheduler`` (a dtrain.lr_scheduler scheduler). ``multi_precision`` is
accepted and changes nothing: the optimizers update float32 weights, and dtrain.torch.Trainer
always trains float16 and bfloat16 parameters through float32 master weights (MXNet's
``multi_precision=True``). A parameter that is unknown or out of range is a
:class:`dtrain.InvalidArgument` naming it, at creation.
"""

from __future__ import annotations

from typing import Any

from . import _dtrain
from .lr_scheduler import LRScheduler

__all__ = ["create", "Optimizer", "SGD", "NAG", "Adam", "AdaGrad", "RMSProp"]

# MXNet parameters with nothing to choose here (multi_precision: half-precision parameters always
# have float32 masters); accepted so scripts carry over. (lazy_update is passed on: a dist store's
# servers apply row-sparse gradients lazily unless it is 0.)
_IGNORED = ("multi_precision", "param_idx2name", "sym", "begin_num_update")


class Optimizer:
    """An optimizer by name and parameters (MXNet's names)."""

    def __init__(self, name: str, **params: Any) -> None:
        lr_scheduler = params.pop("lr_scheduler", None)
        if lr_scheduler is not None and not isinstance(lr_scheduler, LRScheduler):
            raise TypeError("lr_scheduler must be a dtrain.lr_scheduler scheduler, e.g. "
                            "FactorScheduler(step=1000, factor=0.5)")
        for name_ in _IGNORED:
            params.pop(name_, None)
        self.name = name.lower()
        self.params: dict[str, float] = {}
        for key, value in params.items():
            if value is None:  # MXNet's "not set" (clip_gradient=None)
                continue
            if isinstance(value, bool):
                value = float(value)
            if not isinstance(value, (int, float)):
                raise TypeError("optimizer %r: parameter %s must be a number, not %s"
                                % (self.name, key, type(value).__name__))
            self.params[key] = float(value)
        self.lr_scheduler = lr_scheduler
        _dtrain.check_optimizer(*self._spec())

    @property
    def learning_rate(self) -> float:
        return self.params.get("learning_rate", _DEFAULT_LR.get(self.name, 0.01))

    def _spec(self) -> tuple[str, dict[str, float], str]:
        """(name, parameters, schedule name) as the core takes them."""
        params = dict(self.params)
        kind = ""
        if self.lr_scheduler is not None:
            kind = self.lr_scheduler.kind
            params.update({k: float(v) for k, v in self.lr_scheduler._params().items()})
        return self.name, params, kind

    def __repr__(self) -> str:
        return "dtrain.optimizer.create(%r, %s)" % (
            self.name, ", ".join("%s=%g" % kv for kv in sorted(self.params.items())))


_DEFAULT_LR = {"sgd": 0.01, "nag": 0.01, "adagrad": 0.01, "adam": 0.001, "rmsprop": 0.001}


def create(name: str | Optimizer, **kwargs: Any) -> Optimizer:
    """The optimizer `name` ('sgd', 'nag', 'adam', 'adagrad', 'rmsprop') with MXNet's parameters."""
    if isinstance(name, Optimizer):
        return name
    return Optimizer(name, **kwargs)


def SGD(**kwargs: Any) -> Optimizer:
    return Optimizer("sgd", **kwargs)


def NAG(**kwargs: Any) -> Optimizer:
    return Optimizer("nag", **kwargs)


def Adam(**kwargs: Any) -> Optimizer:
    return Optimizer("adam", **kwargs)


def AdaGrad(**kwargs: Any) -> Optimizer:
    return Optimizer("adagrad", **kwargs)


def RMSProp(**kwargs: Any) -> Optimizer:
    return Optimizer("rmsprop", **kwargs)
