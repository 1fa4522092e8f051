// The hostfile of `dtrain launch -H FILE`: one host a line, as a name or an address, optionally
// followed by `:SLOTS`; blank lines and `#` comments (whole-line or trailing) are ignored.
//
//   # two machines, the second with 4 slots
//   node-a
//   10.0.0.2:4
#pragma once

#include <string>
#include <vector>

namespace dtrain::launcher {

struct HostEntry {
  std::string host;
  int slots = 1;  // how many processes the host takes per round (mpirun's slots)
};

// Throws UsageError naming the file and line for a malformed line (bad slots, spaces inside a
// name, ...), an unreadable file, or a file without hosts.
std::vector<HostEntry> ReadHostfile(const std::string& path);
std::vector<HostEntry> ParseHostfile(const std::string& text, const std::string& path_for_errors);

}  // namespace dtrain::launcher
