// Checks of the arrays a KVStore call is given, shared by the store types that hold a value per
// key in this process (local, horovod).
#pragma once

#include <string>
#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

// "[3, 4] float32".
std::string DescribeArray(const Array& a);

// Throws InvalidArgument "<call> of key K: ..." unless `value` can be a key's value: defined,
// with at least one element (an empty tensor is told apart from an undefined one).
void CheckInitValue(const char* call, Key key, const Array& value);

// Every array of `arrays` must match the key's value in element count and dtype (shapes may
// differ: a flattened view of the same value is fine), and there must be at least one. `what` is
// "value" or "out". Throws InvalidArgument naming the call, the key and the array.
void CheckArrays(const char* call, Key key, const Array& expected, const std::vector<Array>& arrays,
                 const char* what);

}  // namespace dtrain
