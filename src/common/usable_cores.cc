#include "common/usable_cores.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace dtrain {

namespace {

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The cgroup of this process, from /proc/self/cgroup: v2's single "0::/path", else v1's cpu
// controller line ("N:cpu,cpuacct:/path"). Empty if neither is there.
std::string CgroupPath(bool* v2) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::string v1_path;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) {
      *v2 = true;
      return line.substr(3);
    }
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::stringstream controllers(line.substr(first + 1, second - first - 1));
    for (std::string c; std::getline(controllers, c, ',');) {
      if (c == "cpu") v1_path = line.substr(second + 1);
    }
  }
  *v2 = false;
  return v1_path;
}

std::optional<int> QuotaCores() {
  bool v2 = false;
  const std::string path = CgroupPath(&v2);
  if (v2) {
    // A container sees its own cgroup as the root of /sys/fs/cgroup; outside one the path is
    // under it. The tightest limit on the way up applies.
    std::optional<int> tightest;
    for (std::string p = path;; p = p.substr(0, p.rfind('/'))) {
      if (auto cores = CoresOfCpuMax(FirstLine("/sys/fs/cgroup" + p + "/cpu.max"))) {
        tightest = std::min(tightest.value_or(*cores), *cores);
      }
      if (p.empty() || p == "/") break;
    }
    return tightest;
  }
  for (const std::string& dir : {"/sys/fs/cgroup/cpu" + path, std::string("/sys/fs/cgroup/cpu")}) {
    const std::string quota = FirstLine(dir + "/cpu.cfs_quota_us");
    const std::string period = FirstLine(dir + "/cpu.cfs_period_us");
    if (quota.empty() || period.empty()) continue;
    try {
      return CoresOfCfsQuota(std::stoll(quota), std::stoll(period));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> CoresOfCfsQuota(long long quota_us, long long period_us) {
  if (quota_us <= 0 || period_us <= 0) return std::nullopt;  // -1: no limit
  return static_cast<int>(std::max<long long>(1, (quota_us + period_us - 1) / period_us));
}

std::optional<int> CoresOfCpuMax(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max") return std::nullopt;
  try {
    size_t used = 0;
    const long long q = std::stoll(quota, &used);
    if (used != quota.size()) return std::nullopt;
    return CoresOfCfsQuota(q, period);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int UsableCores() {
  static const int cores = [] {
    int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = std::min(n, std::max(1, CPU_COUNT(&set)));
    if (auto quota = QuotaCores()) n = std::min(n, *quota);
    return n;
  }();
  return cores;
}

}  // namespace dtrain
