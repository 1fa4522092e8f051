// Reading what training programs leave behind: parameter files and accuracy lines.
#pragma once

#include <string>
#include <vector>

namespace dtrain::testing {

// A file of raw float32 values (trainer_exactness --out).
std::vector<float> ReadFloats(const std::string& path);
// max |a - b| / max |a|.
double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b);
// The last "Epoch N: Test_acc X" of dtrain-train's output; -1 if none.
double LastTestAccuracy(const std::string& output);

// Expects the parameters in two files to agree to 1e-5 (relative).
void ExpectSameParameters(const std::string& reference, const std::string& other);

// The trainer_exactness arguments of one run: a few steps of global batch 16, parameters to `out`.
std::vector<std::string> ExactnessArgs(const std::string& out, std::vector<std::string> extra);

}  // namespace dtrain::testing
