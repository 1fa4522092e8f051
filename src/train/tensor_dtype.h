// Torch scalar types and dtrain's element types, both ways, for the code that hands torch tensors
// to the core (horovod/, the Python extension). Only the float types the core moves map.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "dtrain/common/dtype.h"

namespace dtrain::train {

// nullopt for a type the core does not move (integers, bool, complex).
inline std::optional<DType> DTypeOf(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return DType::kFloat32;
    case torch::kFloat64:
      return DType::kFloat64;
    case torch::kFloat16:
      return DType::kFloat16;
    case torch::kBFloat16:
      return DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

inline torch::ScalarType ScalarTypeOf(DType d) {
  switch (d) {
    case DType::kFloat32:
      return torch::kFloat32;
    case DType::kFloat64:
      return torch::kFloat64;
    case DType::kFloat16:
      return torch::kFloat16;
    case DType::kBFloat16:
      return torch::kBFloat16;
  }
  return torch::kFloat32;
}

}  // namespace dtrain::train
