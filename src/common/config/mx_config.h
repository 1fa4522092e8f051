// Kubeflow's MXJob gives every pod MX_CONFIG, a JSON description of the job, beside the plain
// variables it derives from it (kubeflow/training-operator, pkg/controller.v1/mxnet/pod.go,
// SetClusterSpec):
//
//   {"cluster": {"scheduler": [{"url": "job-scheduler-0", "port": 9091}],
//                "server": [{"url": ..., "port": ...}, ...], "worker": [...]},
//    "labels": {...}, "task": {"type": "worker", "index": 1}}
//
// A pod whose template sets only MX_CONFIG (or an older operator's pods) still starts: the plain
// variables it lacks come from here.
#pragma once

#include <map>
#include <string>

namespace dtrain {

// DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER and DMLC_NUM_WORKER as
// MX_CONFIG `json` gives them (the scheduler's first address; the replica counts; the task's
// type), each only where the JSON has it. Throws ConfigError naming what does not parse.
std::map<std::string, std::string> VariablesFromMxConfig(const std::string& json);

}  // namespace dtrain
