#include "dtrain/kvstore/init.h"

#include "ps/roles.h"

namespace dtrain {

void Initialize() { ps::RunRoleFromEnvironmentIfService(); }

}  // namespace dtrain
