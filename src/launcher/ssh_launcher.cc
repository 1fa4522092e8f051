#include "launcher/backends.h"

namespace dtrain::launcher {

int RunSshJob(const LaunchOptions& options) {
  throw UsageError("launcher 'ssh' is not implemented yet (use --launcher local)");
}

}  // namespace dtrain::launcher
