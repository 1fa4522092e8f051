#include "kvstore/array_checks.h"

#include <algorithm>

#include "compression/codec.h"
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

bool FloatValuesOnDevices(const std::vector<Array>& values) {
  return !values.empty() && std::all_of(values.begin(), values.end(), [&](const Array& a) {
    return a.defined() && a.on_device() && a.dtype() == DType::kFloat32 &&
           a.size() == values[0].size();
  });
}

void CheckPackedValue(const char* call, Key key, const Array& expected,
                      const CompressionSpec& packed_with, const CompressionSpec& store,
                      const Array& packed) {
  const std::string prefix = std::string(call) + " of key " + KeyLabel(key) + " compressed with " +
                             packed_with.ToString() + ": ";
  if (packed_with.type != store.type || packed_with.threshold != store.threshold) {
    throw InvalidArgument(prefix + "the store compresses with " + store.ToString());
  }
  const int64_t n = expected.size();
  if (expected.dtype() != DType::kFloat32) {
    throw InvalidArgument(prefix + "gradient compression works on float32 values, the key holds " +
                          std::string(DTypeName(expected.dtype())));
  }
  if (!store.AppliesTo(n)) {
    throw InvalidArgument(prefix + "the store sends this key (" + std::to_string(n) +
                          " elements) uncompressed");
  }
  const size_t bytes = CompressedBytes(store.type, n);
  if (packed.defined() && packed.on_device()) {
    throw InvalidArgument(prefix + "the packed bytes must be in host memory");
  }
  if (!packed.defined() || packed.nbytes() != bytes) {
    throw InvalidArgument(prefix + "its " + std::to_string(n) + " values take " +
                          std::to_string(bytes) + " bytes, the packed array holds " +
                          std::to_string(packed.defined() ? packed.nbytes() : 0));
  }
}

}  // namespace dtrain
