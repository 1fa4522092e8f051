#include "kvstore/array_checks.h"

#include "dtrain/common/error.h"
#include "kvstore/key_names.h"

namespace dtrain {

std::string DescribeArray(const Array& a) {
  return ShapeToString(a.shape()) + " " + std::string(DTypeName(a.dtype()));
}

void CheckInitValue(const char* call, Key key, const Array& value) {
  if (value.defined() && value.size() > 0) return;
  const std::string where = std::string(call) + " of key " + KeyLabel(key) + ": ";
  if (value.size() == 0 && !value.shape().empty()) {  // e.g. (0,) or (3, 0)
    throw InvalidArgument(where + "the value " + DescribeArray(value) +
                          " has no elements; a key holds at least one");
  }
  throw InvalidArgument(where + "the value is undefined");
}

void CheckArrays(const char* call, Key key, const Array& expected, const std::vector<Array>& arrays,
                 const char* what) {
  const std::string where = std::string(call) + " of key " + KeyLabel(key) + ": ";
  if (arrays.empty()) {
    throw InvalidArgument(where + "no " + what + "s given (pass one array per device)");
  }
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    if (!a.defined()) {
      throw InvalidArgument(where + what + " " + std::to_string(i) + " is an undefined Array");
    }
    if (a.size() != expected.size() || a.dtype() != expected.dtype()) {
      throw InvalidArgument(where + what + " " + std::to_string(i) + " has shape " +
                            DescribeArray(a) + " but the key holds " + DescribeArray(expected) +
                            " (" + std::to_string(expected.size()) + " elements)");
    }
  }
}

}  // namespace dtrain
