// Element types of the values dtrain moves. Only float32 is summed and optimised today; the type is
// carried end to end (API, wire header, server slots) so that float16/bfloat16/float64 can follow
// without a protocol change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dtrain {

enum class DType : uint8_t { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

inline std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

}  // namespace dtrain
