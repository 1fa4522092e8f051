#include "common/config/operator_env.h"

#include <nlohmann/json.hpp>

#include "dtrain/common/error.h"

namespace dtrain {

std::map<std::string, std::string> VariablesFromMxConfig(const std::string& json) {
  std::map<std::string, std::string> out;
  try {
    const auto config = nlohmann::json::parse(json);
    if (!config.is_object()) throw ConfigError("MX_CONFIG is not a JSON object");
    if (const auto cluster = config.find("cluster"); cluster != config.end()) {
      if (!cluster->is_object()) throw ConfigError("MX_CONFIG's \"cluster\" is not an object");
      if (const auto s = cluster->find("scheduler"); s != cluster->end() && !s->empty()) {
        const auto& first = s->at(0);
        out["DMLC_PS_ROOT_URI"] = first.at("url").get<std::string>();
        out["DMLC_PS_ROOT_PORT"] = std::to_string(first.at("port").get<int>());
      }
      if (const auto s = cluster->find("server"); s != cluster->end()) {
        out["DMLC_NUM_SERVER"] = std::to_string(s->size());
      }
      if (const auto w = cluster->find("worker"); w != cluster->end()) {
        out["DMLC_NUM_WORKER"] = std::to_string(w->size());
      }
    }
    if (const auto task = config.find("task"); task != config.end()) {
      out["DMLC_ROLE"] = task->at("type").get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("MX_CONFIG does not parse as Kubeflow MXJob's JSON: ") +
                      e.what());
  }
  return out;
}

std::map<std::string, std::string> VariablesFromTorchrun(const EnvLookup& env) {
  std::map<std::string, std::string> out;
  const auto addr = env("MASTER_ADDR");
  const auto port = env("MASTER_PORT");
  const auto size = env("WORLD_SIZE");
  const auto rank = env("RANK");
  if (!addr || !port || !size || !rank) return out;
  out["DMLC_PS_ROOT_URI"] = *addr;
  out["DMLC_PS_ROOT_PORT"] = *port;
  out["DMLC_NUM_WORKER"] = *size;
  out["DTRAIN_NODE_RANK"] = *rank;
  out["DMLC_NUM_SERVER"] = "0";
  return out;
}

EnvLookup WithOperatorVariables(EnvLookup env) {
  std::map<std::string, std::string> fallback;
  if (auto mx = env("MX_CONFIG"); mx && !mx->empty()) fallback = VariablesFromMxConfig(*mx);
  for (auto& [name, value] : VariablesFromTorchrun(env)) fallback.emplace(name, value);
  if (fallback.empty()) return env;
  return [env = std::move(env), fallback = std::move(fallback)](const std::string& name) {
    if (auto v = env(name)) return v;
    const auto it = fallback.find(name);
    return it == fallback.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

}  // namespace dtrain
