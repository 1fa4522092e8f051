#include "launcher/plan/hostfile.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {
namespace {

constexpr int kMaxSlots = 4096;

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

int ParseSlots(const std::string& text, const std::string& where) {
  int slots = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, slots);
  if (text.empty() || ec != std::errc() || ptr != end || slots < 1 || slots > kMaxSlots) {
    throw UsageError(where + ": bad slot count '" + text + "' (expected HOST or HOST:SLOTS with " +
                     "SLOTS between 1 and " + std::to_string(kMaxSlots) + ")");
  }
  return slots;
}

// One non-empty line without its comment: NAME, NAME:SLOTS, an IPv6 address, or [IPV6]:SLOTS.
HostEntry ParseLine(const std::string& line, const std::string& where) {
  if (line.find_first_of(" \t") != std::string::npos) {
    throw UsageError(where + ": '" + line +
                     "' is not a host (one host a line, as NAME or NAME:SLOTS; an MPI-style "
                     "'NAME slots=N' is written NAME:N)");
  }
  HostEntry e;
  if (line[0] == '[') {
    const size_t close = line.find(']');
    if (close == std::string::npos || close == 1) {
      throw UsageError(where + ": '" + line + "' is not a host (expected [IPV6] or [IPV6]:SLOTS)");
    }
    e.host = line.substr(1, close - 1);
    const std::string rest = line.substr(close + 1);
    if (rest.empty()) return e;
    if (rest[0] != ':') {
      throw UsageError(where + ": '" + line + "' is not a host (expected [IPV6] or [IPV6]:SLOTS)");
    }
    e.slots = ParseSlots(rest.substr(1), where);
    return e;
  }
  const size_t colon = line.find(':');
  // More than one colon without brackets: a bare IPv6 address, which cannot carry slots.
  if (colon == std::string::npos || line.find(':', colon + 1) != std::string::npos) {
    e.host = line;
    return e;
  }
  e.host = line.substr(0, colon);
  if (e.host.empty()) throw UsageError(where + ": '" + line + "' has no host name before ':'");
  e.slots = ParseSlots(line.substr(colon + 1), where);
  return e;
}

}  // namespace

std::vector<HostEntry> ParseHostfile(const std::string& text, const std::string& path_for_errors) {
  std::vector<HostEntry> hosts;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const std::string line = Trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    hosts.push_back(ParseLine(line, path_for_errors + ":" + std::to_string(line_no)));
  }
  if (hosts.empty()) {
    throw UsageError(path_for_errors + ": no hosts in the hostfile (one host a line: NAME or " +
                     "NAME:SLOTS)");
  }
  return hosts;
}

std::vector<HostEntry> ReadHostfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError("-H/--hostfile " + path + ": cannot read it: " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw UsageError("-H/--hostfile " + path + ": read error");
  return ParseHostfile(text.str(), path);
}

}  // namespace dtrain::launcher
