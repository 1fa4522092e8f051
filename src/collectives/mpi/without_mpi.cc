// The mpi backend in a build without OpenMPI: asking for it is a configuration error.
#include "collectives/backend.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

std::unique_ptr<Communicator> CreateMpiBackend(const CollectivesConfig&) {
  throw ConfigError(
      "the mpi backend was asked for (DTRAIN_COLLECTIVES=mpi, or started by mpirun), but this "
      "dtrain was built without OpenMPI; use gloo (`dtrain launch -s 0`) or rebuild with "
      "libopenmpi-dev installed");
}

}  // namespace dtrain::collectives
