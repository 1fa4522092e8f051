// This host's addresses and ports as the launcher picks them for a job's rendezvous.
//
// Threads: any. Failure: UsageError for what the user can fix (a host that does not resolve, no
// route, a bad --interface), dtrain::Error for the system's own failures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain::launcher {

// Whether `host` is this machine: localhost, 127.x.x.x, ::1, this host's name (full or short), or
// one of its IPv4 addresses.
bool IsThisMachine(const std::string& host);

// The local IPv4 address the kernel would send from toward `host`: the scheduler's address as
// that host reaches it. Connecting a UDP socket sends nothing.
std::string LocalAddressToward(const std::string& host);

// The scheduler's address as `host` reaches it: the address of `interface` (--interface) when
// given, else LocalAddressToward(host).
std::string SchedulerAddressToward(const std::string& host,
                                   const std::optional<std::string>& interface);

// A TCP port that is free on every interface here right now (the scheduler binds it a moment
// later; in an allreduce job worker 0 binds it on its own host, where it is only likely free: no
// port can be reserved on another host from here). Chosen at random below the kernel's ephemeral
// range, so that no outgoing connection can take it in between.
uint16_t PickFreePort();

// A TCP port on 127.0.0.1 that is free right now, chosen the same way. The scheduler binds it a
// moment later; only a program that names that port could take it in between, which the scheduler
// then reports, as ps-lite users know it.
uint16_t PickFreeLoopbackPort();

}  // namespace dtrain::launcher
