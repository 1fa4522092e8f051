"""dtrain on Ray clusters (``pip install dtrain[ray]``):

- ``RayExecutor``: Horovod's ``horovod.ray.RayExecutor`` (start, run, run_remote, execute,
  execute_single, shutdown), one actor per rank; ``num_servers`` adds the parameter servers.
- ``ElasticRayExecutor``: Horovod's, an elastic allreduce job on the cluster's live nodes
  (``dtrain launch --launcher ray`` underneath).
- ``Config``: a Ray Train backend (``DataParallelTrainer(..., backend_config=dtrain.ray.Config())``).

Inside the functions they run, ``import dtrain.torch as hvd; hvd.init()`` works as under
``dtrain launch``, and so does ``dtrain.kv.create('dist_sync')`` when there are servers.
"""

try:
    import ray as _ray  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("dtrain.ray needs Ray: pip install 'dtrain[ray]'") from e

from .executor import MiniSettings as MiniSettings, RayExecutor as RayExecutor  # noqa: E402
from .elastic import ElasticRayExecutor as ElasticRayExecutor  # noqa: E402
from .elastic import ElasticSettings as ElasticSettings  # noqa: E402
from .train import Config as Config  # noqa: E402
