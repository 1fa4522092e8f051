#include "launcher/backends.h"

namespace dtrain::launcher {

int RunSlurmJob(const LaunchOptions& options) {
  throw UsageError("launcher 'slurm' is not implemented yet (use --launcher local)");
}

}  // namespace dtrain::launcher
