// The environments Kubeflow's training operators give their pods, read where dtrain's own variables
// are unset.
//
// MXJob gives every pod MX_CONFIG, a JSON description of the job, beside the plain variables it
// derives from it (kubeflow/training-operator, pkg/controller.v1/mxnet/pod.go, SetClusterSpec):
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

#include "common/config/env_reader.h"

namespace dtrain {

// DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER and DMLC_NUM_WORKER as
// MX_CONFIG `json` gives them (the scheduler's first address; the replica counts; the task's
// type), each only where the JSON has it. Throws ConfigError naming what does not parse.
std::map<std::string, std::string> VariablesFromMxConfig(const std::string& json);

// PyTorchJob (and torchrun) give MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK: an allreduce job
// whose rank 0 listens at MASTER_ADDR:MASTER_PORT, as torch.distributed's would. As dtrain's
// variables (DMLC_PS_ROOT_URI/PORT, DMLC_NUM_WORKER, DTRAIN_NODE_RANK, no servers) where all
// four are set; empty otherwise.
std::map<std::string, std::string> VariablesFromTorchrun(const EnvLookup& env);

// `env`, with what MX_CONFIG or torchrun's variables give where `env` leaves a variable unset.
EnvLookup WithOperatorVariables(EnvLookup env);

}  // namespace dtrain
