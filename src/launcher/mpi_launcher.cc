#include "launcher/backends.h"

namespace dtrain::launcher {

int RunMpiJob(const LaunchOptions& options) {
  throw UsageError("launcher 'mpi' is not implemented yet (use --launcher local)");
}

}  // namespace dtrain::launcher
