// Checks on a DType that arrives as a number (a wire header, a negotiation record, a checkpoint),
// before it is cast to dtrain::DType.
#pragma once

#include <cstdint>

#include "dtrain/common/dtype.h"

namespace dtrain {

// How many DType values there are: they run from 0 to kNumDTypes - 1.
constexpr int kNumDTypes = 4;

inline bool IsValidDType(uint32_t raw) { return raw < static_cast<uint32_t>(kNumDTypes); }

}  // namespace dtrain
