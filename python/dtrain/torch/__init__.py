"""Horovod's PyTorch API on dtrain, plus a Gluon-style Trainer.

An existing Horovod script runs after changing its import line::

    import dtrain.torch as hvd
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

Start it with ``mpirun -np 4 python3 train.py`` (OpenMPI) or ``dtrain launch -n 4 -s 0 --
python3 train.py`` (Gloo, no MPI needed). The collectives run on dtrain's C++ engine: tensors are
matched across ranks by name, small allreduces are fused, and a rank that dies makes every other
rank's pending collective raise dtrain.PeerError naming it.

``Trainer`` (trainer.py) is Gluon's Trainer for torch modules over a dtrain KVStore (parameter
servers or the 'horovod' allreduce store).
"""

# `X as X`: a re-export, for type checkers (they do not evaluate the __all__ below).
from .autograd import *  # noqa: F401,F403
from .autograd import __all__ as _autograd_all
from .compression import Compression as Compression  # noqa: F401
from .compression import Compressor as Compressor  # noqa: F401
from .compression import FP16Compressor as FP16Compressor  # noqa: F401
from .compression import NoneCompressor as NoneCompressor  # noqa: F401
from . import elastic as elastic  # noqa: F401  (hvd.elastic: elastic.py)
from .functions import broadcast_optimizer_state as broadcast_optimizer_state  # noqa: F401
from .functions import broadcast_parameters as broadcast_parameters  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops import __all__ as _ops_all
from .optimizer import DistributedOptimizer as DistributedOptimizer  # noqa: F401
from .optimizer import sparse_allreduce_async as sparse_allreduce_async  # noqa: F401
from .process_sets import *  # noqa: F401,F403
from .process_sets import __all__ as _process_sets_all
from .scatter_ops import *  # noqa: F401,F403
from .scatter_ops import __all__ as _scatter_all
from .server_embedding import ServerEmbedding as ServerEmbedding  # noqa: F401
from .sync_batch_norm import SyncBatchNorm as SyncBatchNorm  # noqa: F401
from .trainer import Trainer as Trainer  # noqa: F401

__all__ = list(_ops_all) + list(_autograd_all) + list(_scatter_all) + list(_process_sets_all) + [
    "Compression", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "sparse_allreduce_async", "SyncBatchNorm", "Trainer", "elastic", "ServerEmbedding",
]
