"""dtrain: distributed data-parallel training for PyTorch users, on dtrain's C++ core.

- ``dtrain.kv``: MXNet's KVStore (``kv = dtrain.kv.create('dist_sync')``) on torch tensors.
- ``dtrain.torch``: Horovod's PyTorch API (``import dtrain.torch as hvd``) and a Gluon-style
  ``Trainer``.
- ``dtrain.optimizer``, ``dtrain.lr_scheduler``: MXNet's optimizers by name, run by the core.
- ``dtrain.data``: ``SplitSampler`` (the data set split over workers) and ``split_and_load``.

Roles on import, as ``import mxnet`` does: a process started with ``DMLC_ROLE=server`` or
``DMLC_ROLE=scheduler`` runs that role when it imports dtrain and exits when the job ends, so one
script serves every role of a job started by ``dtrain launch``, MXNet's ``tools/launch.py`` or by
hand.
"""

import atexit as _atexit
import sys as _sys

import torch as _torch  # noqa: F401  (loads LibTorch before the extension that links it)

from . import _dtrain, _lifetime
from .errors import ConfigError, Error, InvalidArgument, PeerError, TimeoutError  # noqa: F401

__version__ = "0.1.0"


def _run_role_if_service():
    code = _dtrain.run_role_if_service()
    if code is not None:
        _sys.stdout.flush()
        _sys.stderr.flush()
        _sys.exit(code)


_run_role_if_service()

from . import data, kv, lr_scheduler, optimizer  # noqa: E402

kvstore = kv  # MXNet spells it both ways: mx.kv and mx.kvstore


def _close_everything():
    _lifetime.close_all()
    if _dtrain.collectives_is_initialized():
        _dtrain.collectives_shutdown()


_atexit.register(_close_everything)
