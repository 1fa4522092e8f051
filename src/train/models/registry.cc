// MakeNetwork: picks a model family by name.
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/train/models/network.h"
#include "train/models/families.h"

namespace dtrain::train {
namespace {

struct Family {
  const char* name;
  std::shared_ptr<Network> (*make)(InputShape input, int64_t classes);
};

constexpr Family kFamilies[] = {
    {"mlp", &MakeMlp},
    {"lenet", &MakeLeNet},
    {"resnet18", &MakeResNet18},
    {"vgg11", &MakeVgg11},
};

std::string KnownNames() {
  std::string known;
  for (const Family& family : kFamilies)
    known += (known.empty() ? "" : ", ") + std::string(family.name);
  return known;
}

}  // namespace

std::shared_ptr<Network> MakeNetwork(const std::string& name, InputShape input, int64_t classes) {
  for (const Family& family : kFamilies) {
    if (name != family.name) continue;
    if (input.channels <= 0 || input.height <= 0 || input.width <= 0) {
      throw InvalidArgument("network '" + name + "': input shape must be positive, got " +
                            std::to_string(input.channels) + "x" + std::to_string(input.height) +
                            "x" + std::to_string(input.width));
    }
    if (classes <= 0) {
      throw InvalidArgument("network '" + name + "': number of classes must be positive, got " +
                            std::to_string(classes));
    }
    return family.make(input, classes);
  }
  throw InvalidArgument("unknown network '" + name + "' (known: " + KnownNames() + ")");
}

std::vector<std::string> NetworkNames() {
  std::vector<std::string> names;
  for (const Family& family : kFamilies) names.emplace_back(family.name);
  return names;
}

}  // namespace dtrain::train
