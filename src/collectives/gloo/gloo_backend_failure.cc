// A failed gloo call of GlooBackend (gloo_backend.h): every connection closed so that the ranks
// blocked on this one fail at once, the rank that left named from the rendezvous host's record
// (or the timeout said), and every later call failing the same way.
#include <mutex>
#include <string_view>
#include <thread>

#include "collectives/error_text.h"
#include "collectives/gloo/gloo_backend.h"
#include "collectives/gloo/rendezvous_client.h"
#include "report/reporter.h"

namespace dtrain::collectives {
namespace {

bool IsTimeout(const std::exception& e) {
  return std::string_view(e.what()).find("Timed out") != std::string_view::npos;
}

}  // namespace

void GlooBackend::ThrowIfBroken() const {
  if (timed_out_) throw TimeoutError(failure_);
  if (!failure_.empty()) throw PeerError(failure_);
}

void GlooBackend::Fail(const char* what, const std::exception& gloo_error) {
  Fail(what, gloo_error.what(), IsTimeout(gloo_error));
}

void GlooBackend::Fail(const char* what, const std::string& gloo_error, bool timeout) {
  // Our peers may be blocked on us: close every connection so that they fail now too.
  cached_.clear();
  cached_bytes_ = 0;
  CloseConnections();
  std::string cause;
  if (!timeout) {
    cause = watchdog_ ? watchdog_->found() : "";
    if (cause.empty()) cause = LostRanksText(Duration(2000));
  }
  failure_ = "gloo " + std::string(what) + " failed on rank " + std::to_string(global_rank_) +
             ": " +
             (timeout ? "no progress within " + SecondsText(timeout_) +
                            " (DTRAIN_COLLECTIVE_TIMEOUT_MS); a rank is stuck or far behind"
              : cause.empty() ? "a connection broke"
                              : cause) +
             " (gloo: " + gloo_error + ")";
  if (timeout) {
    timed_out_ = true;
    throw TimeoutError(failure_);
  }
  throw PeerError(failure_);
}

std::string GlooBackend::LostRanksText(Duration grace) {
  RendezvousClient* client = mesh_->client.get();
  if (!client) return {};
  const Deadline deadline(grace);
  try {
    while (true) {
      auto lost = client->LostRanks(Duration(2000));
      std::erase_if(lost, [this](const LostRank& l) {
        return l.rank == global_rank_ || l.rank < 0 ||
               static_cast<size_t>(l.rank) >= mesh_->peers.size();
      });
      if (!lost.empty()) {
        std::string text;
        for (size_t i = 0; i < lost.size(); ++i) {
          const char* separator = i == 0 ? "" : i == 1 ? "; then " : "; ";
          text += separator + mesh_->peers[lost[i].rank] + " " + lost[i].why;
        }
        // The launcher names the rank the job failed for from this record.
        static std::once_flag reported;
        std::call_once(reported, [&] {
          report::Send({{"kind", "failure"},
                        {"node", {{"role", "worker"}, {"rank", lost[0].rank}}},
                        {"cause", lost[0].why}});
        });
        return text;
      }
      if (deadline.passed()) return {};
      std::this_thread::sleep_for(Duration(50));
    }
  } catch (const Error&) {
    return mesh_->peers[0] + ", the rendezvous host at " + client->endpoint() +
           ", left the job or stopped answering";
  }
}

void GlooBackend::CloseConnections() {
  context_->closeConnections();
  if (leaders_) leaders_->closeConnections();
}

}  // namespace dtrain::collectives
