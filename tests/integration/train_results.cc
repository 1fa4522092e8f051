#include "train_results.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>

#include "subprocess.h"

namespace dtrain::testing {

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(a[i])));
  }
  return den == 0 ? num : num / den;
}

double LastTestAccuracy(const std::string& output) {
  std::smatch m;
  std::regex re("Epoch \\d+: Test_acc ([0-9.]+)");
  double last = -1;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    last = std::stod((*it)[1]);
  }
  return last;
}

void ExpectSameParameters(const std::string& reference, const std::string& other) {
  auto a = ReadFloats(reference), b = ReadFloats(other);
  ASSERT_FALSE(a.empty()) << reference;
  EXPECT_LT(MaxRelativeDifference(a, b), 1e-5) << reference << " vs " << other;
}

std::vector<std::string> ExactnessArgs(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {BinaryPath("tests/programs/trainer_exactness"),
                                   "--out",
                                   out,
                                   "--global-batch",
                                   "16",
                                   "--steps",
                                   "4"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace dtrain::testing
