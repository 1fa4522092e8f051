// dtrain::Initialize(): the first call of a training program.
//
// With DMLC_ROLE=scheduler or server this runs that role and exits the process when the job ends,
// as `import mxnet` does, so one binary serves every role of a job. For workers and programs
// outside a job it reads and validates the configuration (throwing ConfigError on a bad variable)
// and returns. KVStore::Create of a dist type does the same, so calling this is optional but lets
// the services start before the program loads its data.
#pragma once

namespace dtrain {

void Initialize();

}  // namespace dtrain
