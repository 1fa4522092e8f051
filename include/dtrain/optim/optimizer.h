// OptimizerSpec: which optimizer updates the weights, and with what parameters, wherever it runs
// (KVStore::SetOptimizer: on the servers, update_on_kvstore; TrainerOptions::optimizer: on the
// servers or in the worker). The same code runs on both sides, so both give identical results,
// each exactly as MXNet 1.x's optimizer of that name computes it in float32.
//
// Names (case-insensitive) and parameters, MXNet's names and defaults:
//   every one      learning_rate (sgd, nag, adagrad 0.01; adam, rmsprop 0.001), wd 0 (weight
//                  decay), rescale_grad 1 (the gradient is multiplied by it first, e.g. 1/batch),
//                  clip_gradient -1 (<= 0 off; else the rescaled gradient is clipped to [-c, c])
//   sgd            momentum 0 (in [0, 1)), nesterov 0 (0 or 1); "nag" is sgd with nesterov 1
//   adam           beta1 0.9, beta2 0.999, epsilon 1e-8 (MXNet's bias correction through the rate)
//   adagrad        eps 1e-7 (also accepted as "epsilon")
//   rmsprop        gamma1 0.9, gamma2 0.9, epsilon 1e-8, centered 0 (Graves' variant when 1),
//                  clip_weights -1
// Learning-rate schedules (lr_scheduler, as MXNet's FactorScheduler and CosineScheduler), their
// parameters in `params` with an "lr_" prefix:
//   "step"     lr_step (required, whole >= 1), lr_factor 1, lr_stop_factor_lr 1e-8
//   "cosine"   lr_max_update (required, whole >= 1), lr_final 0
//   both       lr_warmup_steps 0, lr_warmup_begin 0
// An update counts from 1 per key, as MXNet counts, and the schedule's rate is that count's.
// A bad name, parameter or value is an InvalidArgument naming it and what is accepted, thrown
// where the spec is used (SetOptimizer, the Trainer's set-up), before any update.
#pragma once

#include <map>
#include <string>

namespace dtrain {

// What is sent to servers to build the same optimizer there: a name, numeric parameters with
// MXNet's names ("learning_rate", "momentum", "wd", "rescale_grad", "clip_gradient"), and the
// learning-rate schedule.
struct OptimizerSpec {
  std::string name;
  std::map<std::string, double> params;
  // "" (none, the default), "step" (MXNet's FactorScheduler) or "cosine" (CosineScheduler); their
  // parameters are in `params` (above), checked where the spec is used.
  std::string lr_scheduler = "";

  // {"name": "sgd", "params": {"learning_rate": 0.1}}, with "lr_scheduler": "step" added when a
  // schedule is set. Throws InvalidArgument for a value JSON cannot carry (NaN, infinity, text
  // that is not UTF-8).
  std::string ToJson() const;
  // The inverse of ToJson. The text comes off the network, so anything else (not JSON, other
  // fields, a non-numeric parameter, a non-string lr_scheduler) is an InvalidArgument saying what
  // is wrong; never a crash. Whether the name and parameters mean anything is checked where the
  // spec is used.
  static OptimizerSpec FromJson(const std::string& json);
};

}  // namespace dtrain
