// How many cores this process may keep busy: the machine's, fewer where its CPU affinity mask
// (taskset, Slurm's binding) or its cgroup's CPU quota (a Kubernetes pod's or a Docker
// container's CPU limit, cgroup v2 cpu.max or v1 cpu.cfs_quota_us) allows less. Thread pools
// sized by the machine's count alone oversubscribe a limited pod and are throttled.
#pragma once

#include <optional>
#include <string>

namespace dtrain {

int UsableCores();

// The cores a cgroup quota allows (rounded up, at least 1), from a cgroup v2 "cpu.max" line
// ("max 100000" or "150000 100000") or v1's quota and period; nullopt for no limit or a line
// that does not parse. Split out for the tests.
std::optional<int> CoresOfCpuMax(const std::string& cpu_max);
std::optional<int> CoresOfCfsQuota(long long quota_us, long long period_us);

}  // namespace dtrain
