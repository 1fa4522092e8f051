#include "launcher/backends.h"

namespace dtrain::launcher {

int RunSgeJob(const LaunchOptions& options) {
  throw UsageError("launcher 'sge' is not implemented yet (use --launcher local)");
}

}  // namespace dtrain::launcher
