// One factory per model family; MakeNetwork (registry.cc) picks one by name and has already
// checked that every dimension of `input` and `classes` are positive.
#pragma once

#include <cstdint>
#include <memory>

#include "dtrain/train/models/network.h"

namespace dtrain::train {

std::shared_ptr<Network> MakeMlp(InputShape input, int64_t classes);
std::shared_ptr<Network> MakeLeNet(InputShape input, int64_t classes);
std::shared_ptr<Network> MakeResNet18(InputShape input, int64_t classes);
std::shared_ptr<Network> MakeVgg11(InputShape input, int64_t classes);

}  // namespace dtrain::train
