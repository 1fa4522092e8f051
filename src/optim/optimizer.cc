#include "optim/optimizer.h"

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>

#include "dtrain/common/error.h"
#include "optim/rules/adagrad.h"
#include "optim/rules/adam.h"
#include "optim/rules/rmsprop.h"
#include "optim/rules/sgd.h"

namespace dtrain {
namespace {

using Json = nlohmann::json;

// An optimizer spec is a few hundred bytes; refusing anything far bigger bounds the work a bad
// message off the network can cause.
constexpr size_t kMaxSpecBytes = 64 * 1024;

template <typename T>
std::unique_ptr<Optimizer> Make(const OptimizerSpec& spec) {
  return std::make_unique<T>(spec);
}

std::unique_ptr<Optimizer> MakeNag(const OptimizerSpec& spec) {
  return std::make_unique<SGD>(spec, /*nag=*/true);
}

struct Registration {
  std::string_view name;  // lower case
  std::unique_ptr<Optimizer> (*create)(const OptimizerSpec&);
};

// Every optimizer CreateOptimizer knows; adding one is one line here.
constexpr Registration kOptimizers[] = {
    {"sgd", &Make<SGD>},         {"nag", &MakeNag},           {"adam", &Make<Adam>},
    {"adagrad", &Make<AdaGrad>}, {"rmsprop", &Make<RMSProp>},
};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

[[noreturn]] void BadSpec(const std::string& why) {
  throw InvalidArgument("invalid optimizer spec: " + why);
}

}  // namespace

std::string OptimizerSpec::ToJson() const {
  Json params = Json::object();
  for (const auto& [key, value] : this->params) {
    // JSON has no NaN or infinity: nlohmann would write null, which FromJson then refuses on the
    // far side. Better to fail here, where the caller can see why.
    if (!std::isfinite(value)) {
      throw InvalidArgument("optimizer '" + name + "': parameter " + key +
                            " is not a finite number and cannot be sent");
    }
    params[key] = value;
  }
  Json doc{{"name", name}, {"params", std::move(params)}};
  // Left out when empty, so that a spec without a schedule reads as it always has.
  if (!lr_scheduler.empty()) doc["lr_scheduler"] = lr_scheduler;
  try {
    return doc.dump();
  } catch (const Json::exception& e) {  // a name that is not UTF-8
    throw InvalidArgument("optimizer spec '" + name + "' cannot be written as JSON: " + e.what());
  }
}

OptimizerSpec OptimizerSpec::FromJson(const std::string& json) {
  if (json.size() > kMaxSpecBytes) {
    BadSpec(std::to_string(json.size()) + " bytes, more than the " + std::to_string(kMaxSpecBytes) +
            " a spec may have");
  }
  Json doc;
  try {
    doc = Json::parse(json);
  } catch (const Json::exception& e) {
    BadSpec(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) BadSpec("expected a JSON object, got " + std::string(doc.type_name()));
  for (const auto& [field, value] : doc.items()) {
    if (field != "name" && field != "params" && field != "lr_scheduler") {
      BadSpec("unexpected field '" + field +
              "' (a spec has \"name\", \"params\" and optionally \"lr_scheduler\")");
    }
  }
  const auto name = doc.find("name");
  if (name == doc.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    BadSpec("\"name\" must be a non-empty string");
  }
  const auto params = doc.find("params");
  if (params == doc.end() || !params->is_object()) {
    BadSpec("\"params\" must be an object of numbers");
  }
  const auto lr_scheduler = doc.find("lr_scheduler");
  if (lr_scheduler != doc.end() && !lr_scheduler->is_string()) {
    BadSpec("\"lr_scheduler\" must be a string, got " + std::string(lr_scheduler->type_name()));
  }
  OptimizerSpec spec;
  spec.name = name->get<std::string>();
  if (lr_scheduler != doc.end()) spec.lr_scheduler = lr_scheduler->get<std::string>();
  for (const auto& [key, value] : params->items()) {
    // is_number is false for booleans: "nesterov": true must be written as 1.
    if (!value.is_number()) {
      BadSpec("parameter '" + key + "' of optimizer '" + spec.name + "' must be a number, got " +
              std::string(value.type_name()));
    }
    spec.params[key] = value.get<double>();
  }
  return spec;
}

std::unique_ptr<Optimizer> CreateOptimizer(const OptimizerSpec& spec) {
  const std::string name = Lower(spec.name);
  for (const Registration& r : kOptimizers) {
    if (r.name == name) return r.create(spec);
  }
  std::string known;
  for (const Registration& r : kOptimizers) {
    known += (known.empty() ? "" : ", ") + std::string(r.name);
  }
  throw InvalidArgument("unknown optimizer '" + spec.name + "'; known optimizers: " + known);
}

}  // namespace dtrain
