// Checks of the arrays a KVStore call is given, shared by the store types.
#pragma once

#include <string>
#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/compression/compression_spec.h"
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

// Whether `values` are float32 arrays in device memory, all of one size: what gradient compression
// on a GPU takes (compression/kernels/device_codec.h). False for none.
bool FloatValuesOnDevices(const std::vector<Array>& values);

// A value compressed by the caller (StagedCalls, PackedPushes) for a key holding `expected`'s
// layout, in a store that compresses with `store`: throws InvalidArgument "<call> of key K
// compressed with ...: ..." unless `packed_with` has the store's type and threshold, the key holds
// float32 values that the store compresses, and `packed` is a host array of the compressed size.
void CheckPackedValue(const char* call, Key key, const Array& expected,
                      const CompressionSpec& packed_with, const CompressionSpec& store,
                      const Array& packed);

}  // namespace dtrain
