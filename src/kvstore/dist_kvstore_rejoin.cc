// A replacement worker's side of a restart (docs/reliability.md, "Restarts"): where its rank
// resumes, which setup steps the job had completed, and what a server restored meanwhile needs.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "common/logging.h"
#include "dtrain/common/error.h"
#include "kvstore/dist_kvstore.h"
#include "kvstore/operation_state.h"
#include "ps/checkpoint_file.h"

namespace dtrain {

using transport::Command;
using transport::Message;

void DistKVStore::Rejoin() {
  const int servers = node_.layout().num_servers;
  auto counts = std::make_shared<std::set<int64_t>>();
  // Each slot's rounds, with the server that holds it.
  auto pushed = std::make_shared<std::vector<std::pair<int, ps::SlotRounds>>>();
  AskEveryServer("asking where this worker's rank is", {{"cmd", "rejoin_state"}},
                 [counts, pushed](int s, const Message& reply) {
                   auto meta = nlohmann::json::parse(reply.meta, nullptr, false);
                   try {
                     for (int64_t c : meta.at("counts").get<std::vector<int64_t>>()) {
                       counts->insert(c);
                     }
                     for (const auto& e : meta.at("pushed")) {
                       pushed->emplace_back(
                           s, ps::SlotRounds{e.at(0).get<uint64_t>(), e.at(1).get<uint32_t>(),
                                             e.at(2).get<int64_t>()});
                     }
                   } catch (const nlohmann::json::exception&) {
                     throw PeerError("malformed rejoin state from server " + std::to_string(s));
                   }
                 });
  // Training pushes every key once a step, so the lost process had pushed each key of its last
  // step or not: its slots are at the most rounds, or one fewer, and it died in the step of the
  // fewer. Keys pushed once (a setup key, a metric) lag further behind and do not count. The
  // answers were read on transport threads; AskEveryServer's wait ordered them before this.
  // Which setup steps the job had completed comes from the scheduler's count of setup barriers,
  // not from these counts: asynchronous keys have none, and a process lost between rank 0's init
  // and the init barrier leaves counts of 0 (issue 63: the replacement skipped a barrier the
  // others waited at, or waited at one they had passed).
  setup_barriers_done_by_the_job_ = node_.setup_barriers_before_joining();
  if (!counts->empty()) {
    const int64_t most = *counts->rbegin();
    rounds_done_ = *counts->lower_bound(most - 1);
  }
  // Where each slot's rounds resume (the server's "rejoin" below): the push log counts from there.
  for (const auto& [server, s] : *pushed) {
    client_.StartLogAt(server, s.key, s.part, std::min(s.rounds, rounds_done_));
  }
  std::vector<std::pair<int, Message>> requests;
  for (int s = 0; s < servers; ++s) requests.emplace_back(s, ResumeRequest());
  RequestAndWait("resuming at round " + std::to_string(rounds_done_), std::move(requests));
  resume_told_ = true;
  DTRAIN_LOG(kConnections) << "replacing a lost worker: resuming at round " << rounds_done_;
  if (log_pushes_) {
    // The lost process's pushes since the servers' last checkpoints are gone with it, and this
    // process's log starts where its rank resumes: until every server has written a checkpoint
    // covering those rounds, a lost server could not be restored. Wait for them (issue 63).
    AskEveryServer("waiting for the servers' checkpoints of the rounds so far",
                   {{"cmd", "checkpoint_now"}, {"durable", true}}, [](int, const Message&) {});
  }
}

Message DistKVStore::ResumeRequest() const {
  Message msg;
  msg.header.command = Command::kCommand;
  msg.meta = nlohmann::json{{"cmd", "rejoin"}, {"round", rounds_done_}}.dump();
  return msg;
}

void DistKVStore::OnServerRestarted(int server) {
  auto state = std::make_shared<OperationState>(
      "asking server " + std::to_string(server) + "'s replacement where it resumes", 1,
      config_.request_timeout);
  auto restored = std::make_shared<std::map<std::pair<uint64_t, uint32_t>, int64_t>>();
  Message msg;
  msg.header.command = Command::kCommand;
  msg.meta = R"({"cmd":"restored_rounds"})";
  client_.RequestPastHold(
      server, std::move(msg), [state, restored](const Message* reply, std::exception_ptr error) {
        if (reply) {
          try {
            for (const ps::SlotRounds& s : ps::DecodeSlotRounds(reply->meta)) {
              (*restored)[{s.key, s.part}] = s.rounds;
            }
          } catch (const ProtocolError& e) {
            error = std::make_exception_ptr(PeerError(std::string("its answer: ") + e.what()));
          }
        }
        state->PartDone(error);
      });
  try {
    state->Wait();
    if (resume_told_ && log_pushes_ && !client_.LoggedPushTo(server)) {
      // This replacement told the lost server where its rank resumes, and has pushed nothing to
      // it since: the replacement server restored the lost process's counts without that (a
      // round the lost process had pushed would count this process's push twice). Tell it again
      // before anything is repeated (issue 63).
      auto told = std::make_shared<OperationState>(
          "telling server " + std::to_string(server) + "'s replacement where this rank resumes", 1,
          config_.request_timeout);
      client_.RequestPastHold(
          server, ResumeRequest(),
          [told](const Message*, std::exception_ptr error) { told->PartDone(error); });
      told->Wait();
    }
  } catch (const Error& e) {
    return client_.FailAll(e.what());
  }
  client_.Resume(server, *restored);
}

bool DistKVStore::TakeSetupDoneByTheJob() {
  if (setup_barriers_done_by_the_job_ == 0) return false;
  --setup_barriers_done_by_the_job_;
  return true;
}

}  // namespace dtrain
