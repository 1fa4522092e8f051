// Small pieces of the error and warning messages of this folder, so that they read alike.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

// "1.5 s", "600 s".
inline std::string SecondsText(Duration d) {
  std::ostringstream out;
  out << Seconds(d) << " s";
  return out.str();
}

// "rank 1", "ranks 1, 3".
inline std::string RankList(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace dtrain::collectives
