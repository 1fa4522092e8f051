// What a process of a job tells `dtrain launch`: structured records instead of log lines.
//
// `dtrain launch` listens for them and hands every process DTRAIN_REPORT_ADDR (host:port) and
// DTRAIN_REPORT_TOKEN. A process connects at its first record, says hello with the token and its
// identity, learns the launcher's clock (for timelines) and then sends one JSON object per line:
//
//   {"kind":"state","state":"running"}                       the node joined its job
//   {"kind":"progress","steps":..,"samples":..,"samples_per_s":..,"wait_s":..}   a worker, each
//   second
//   {"kind":"traffic","bytes_in":..,"bytes_out":..}          a server, each second
//   {"kind":"failure","node":{"role","rank","host"},"cause":".."}   the node the job fails for
//   {"kind":"error","message":".."}                           this process failed
//   {"kind":"summary",...}                                    a worker at its end
//   {"kind":"heartbeat"}                                      each second, from the sender thread
//   [{...},{...}]                                             timeline events (timeline.h), as text
// Every record also carries "role", "rank", "host", "pid" and "t_us" (the launcher's clock).
//
// Sending never blocks the caller and never throws: records queue for a sender thread that writes
// them; past 64 MiB queued, only failures, errors, states and summaries are still taken. Without
// DTRAIN_REPORT_ADDR, or when the launcher cannot be reached, records are dropped (logged once at
// PS_VERBOSE=1). Reporting is advice for the launcher, never a reason for a job to fail.
//
// Threads: any thread. The sender thread lives until the process exits; an exit handler flushes
// what is queued (bounded by a second).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace dtrain::report {

// True when a launcher listens (DTRAIN_REPORT_ADDR is set).
bool Enabled();

// Queues `record` (a JSON object with "kind") for the launcher.
void Send(nlohmann::json record);
// Queues a line that is already JSON text ending in '\n': the timeline's event batches, "[...]",
// which the launcher keeps as they are.
void SendLine(std::string line);

// This process's identity in every record. Before a call, it comes from DMLC_ROLE,
// DTRAIN_NODE_RANK and DMLC_NODE_HOST (or the host name).
void SetIdentity(const std::string& role, int rank, const std::string& host);

// `provider` is asked each second for a record to send (null json: nothing this time), on the
// sender thread: servers report their traffic this way. Returns an id for RemovePeriodic.
int AddPeriodic(std::function<nlohmann::json()> provider);
void RemovePeriodic(int id);

// Waits until the queue is written, at most `timeout`: before a process exits on a failure.
void Flush(std::chrono::milliseconds timeout);

// Microseconds of the launcher's clock (system_clock) for the local time point `local`: the offset
// measured at hello is added. The local system clock when no launcher answered.
int64_t LauncherMicros(std::chrono::system_clock::time_point local);

}  // namespace dtrain::report
