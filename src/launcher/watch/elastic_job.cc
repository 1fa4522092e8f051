#include "launcher/watch/elastic_job.h"

#include <signal.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "launcher/run/host_discovery.h"
#include "launcher/watch/process_description.h"
#include "launcher/watch/watch_loop.h"

namespace dtrain::launcher {
namespace {

struct Worker : WatchedProcess {
  using WatchedProcess::WatchedProcess;

  int id = 0;        // its number in start order: "worker 3"
  std::string slot;  // the discovered host it takes a slot of
  UniqueFd log;
  bool leaving = false;  // told to leave at its next join (leave_why says why)
  std::string leave_why;
  bool joined = false;    // it had a rank in a membership
  bool finished = false;  // exited 0
  // Its join request, while it waits for a membership.
  ReportServer::ReplyFn join;
  std::string peer_address;       // where its join came from: rank 0's is the rendezvous host
  int64_t rolled_back_steps = 0;  // its join's: steps it redoes since its last commit

  std::optional<NodeKey> Node() const override { return NodeKey{Role::kWorker, id}; }
  std::string Who() const override { return DescribeProcess(spec, pid); }
  bool live() const { return pid != 0 && !reported && !reaped; }
};

std::string Names(const std::vector<Worker*>& workers) {
  std::string text;
  for (size_t i = 0; i < workers.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == workers.size() ? " and " : ", ") + workers[i]->Who();
  }
  return text;
}

class ElasticSupervisor : public JobWatch {
 public:
  ElasticSupervisor(const ProcessSpec& worker, const SupervisorOptions& options,
                    const ElasticOptions& elastic)
      : JobWatch(options),
        template_(worker),
        elastic_(elastic),
        discovery_timer_(io_),
        below_min_timer_(io_),
        join_timer_(io_) {}

 private:
  // --- start ---

  bool CreateProcesses() override {
    if (!CreateOutputDirectory()) return false;
    Discover();
    return Reconcile(/*now=*/false);
  }

  void OnStarted(WatchedProcess* p, StartedProcess started) override {
    Worker* w = static_cast<Worker*>(p);
    const std::string prefix = "[" + w->spec.Name() + "] ";
    w->out = MergePipe(w, std::move(started.stdout_read), prefix, false, w->log.get());
    w->err = MergePipe(w, std::move(started.stderr_read), prefix, true, w->log.get());
  }

  void OnAllStarted() override {
    ScheduleDiscovery();
    CheckEnough();
  }

  // --- slots ---

  // Runs the script; keeps the last good answer when it fails.
  void Discover() {
    std::vector<HostEntry> found;
    try {
      found = DiscoverHosts(elastic_.discovery_script, elastic_.discovery_deadline);
    } catch (const std::exception& e) {
      if (e.what() != last_discovery_error_)
        Say(std::string(e.what()) + "; keeping the last hosts");
      last_discovery_error_ = e.what();
      return;
    }
    last_discovery_error_.clear();
    // A refused host is asked about again once the script has stopped listing it.
    std::erase_if(refused_hosts_, [&found](const std::string& host) {
      return std::none_of(found.begin(), found.end(),
                          [&host](const HostEntry& h) { return h.host == host; });
    });
    std::map<std::string, int> slots;
    for (const HostEntry& h : found) {
      if (refused_hosts_.count(h.host)) continue;
      if (std::optional<std::string> why = elastic_.hosts->Refuse(h.host)) {
        refused_hosts_.insert(h.host);
        Say("the host discovery script offers " + h.host + ", " + *why + "; ignored");
        continue;
      }
      slots[h.host] += h.slots;
    }
    for (auto& [host, count] : slots_) {
      auto now = slots.find(host);
      if (now == slots.end() || now->second != count) retired_.erase(host);  // fresh again
      if (now != slots.end()) continue;
      for (Worker* w : Live()) {
        if (w->slot == host && !w->leaving) {
          w->leaving = true;
          w->leave_why = "the host discovery script no longer lists " + w->slot;
          ++hosts_version_;
          Say("the host discovery script dropped " + host + ": " + w->Who() +
              " leaves at the next commit");
          if (w->join) ReplyLeave(w);
        }
      }
    }
    hosts_order_.clear();
    for (const HostEntry& h : found) {
      if (slots.count(h.host) &&
          std::find(hosts_order_.begin(), hosts_order_.end(), h.host) == hosts_order_.end()) {
        hosts_order_.push_back(h.host);
      }
    }
    slots_ = std::move(slots);
  }

  void ScheduleDiscovery() {
    discovery_timer_.expires_after(elastic_.discovery_interval);
    discovery_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase() != Phase::kRunning) return;
      Discover();
      Reconcile(/*now=*/true);
      CheckEnough();
      TryForm();
      ScheduleDiscovery();
    });
  }

  // Starts a worker on every free slot, up to max_np. `now`: while the job runs (else the
  // workers are only created, for StartAll). False when one cannot be created.
  bool Reconcile(bool now) {
    // Training is over once a worker finished: its slot is not free for a newcomer.
    if (finished_ || (ever_started_ && Live().empty())) return true;
    int members = static_cast<int>(Members().size());
    for (const std::string& host : hosts_order_) {
      int used = retired_[host];
      for (Worker* w : Live()) used += w->slot == host ? 1 : 0;
      for (int free = slots_[host] - used; free > 0 && members < elastic_.max_np; --free) {
        if (!Add(host, now)) return false;
        ++members;
      }
    }
    return true;
  }

  bool Add(const std::string& host, bool now) {
    auto w = std::make_unique<Worker>(io_);
    w->id = next_id_++;
    w->slot = host;
    ProcessSpec spec = template_;
    spec.rank = w->id;
    spec.env.push_back({"DTRAIN_NODE_RANK", std::to_string(w->id)});
    w->spec = elastic_.hosts->Place(spec, host);
    w->name = w->spec.Name();
    bool ok = true;
    w->log = OpenLog(w->spec.LogFileName(), &ok);
    if (!ok) return false;
    Worker* raw = w.get();
    workers_.push_back(std::move(w));
    ever_started_ = true;
    added_version_ = ++hosts_version_;
    if (!now) {
      Watch(raw);
      return true;
    }
    Say("starting worker " + std::to_string(raw->id) + " on a free slot of " + host +
        "; the others take it in at their next commit");
    if (!StartLater(raw)) return false;
    return true;
  }

  // Workers started and not yet exited.
  std::vector<Worker*> Live() const {
    std::vector<Worker*> live;
    for (auto& w : workers_) {
      if (w->live()) live.push_back(w.get());
    }
    return live;
  }

  // The live workers that stay in the job.
  std::vector<Worker*> Members() const {
    std::vector<Worker*> members;
    for (Worker* w : Live()) {
      if (!w->leaving) members.push_back(w);
    }
    return members;
  }

  // Below min_np the job waits elastic_timeout for slots; never before the first membership's
  // workers had a chance to start.
  void CheckEnough() {
    const int members = static_cast<int>(Members().size());
    if (members >= elastic_.min_np || finished_) {  // finished: the others only end their part
      if (below_min_) below_min_timer_.cancel();
      below_min_ = false;
      return;
    }
    if (below_min_) return;
    below_min_ = true;
    Say(std::to_string(members) + " worker(s), fewer than --min-np " +
        std::to_string(elastic_.min_np) + ": waiting up to " + TimeoutText() +
        " for the host discovery script to offer slots");
    below_min_timer_.expires_after(elastic_.timeout);
    below_min_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec || phase() != Phase::kRunning || !below_min_) return;
      Say("still fewer workers than --min-np " + std::to_string(elastic_.min_np) + " after " +
          TimeoutText() + "; stopping the job");
      set_exit_code(1);
      BeginStop();
    });
  }

  // --- memberships ---

  void OnRequest(const NodeKey& from, const std::string& peer_address,
                 const nlohmann::json& request, ReportServer::ReplyFn reply) override {
    Worker* w = Find(from);
    if (w == nullptr) return;  // not a worker of this job: nothing to answer
    const std::string kind = request.value("kind", "");
    if (kind == "elastic_hosts") {
      reply({{"kind", "elastic_hosts"},
             {"hosts_version", hosts_version_},
             {"added_version", added_version_}});
    } else if (kind == "elastic_join") {
      w->join = std::move(reply);
      w->peer_address = peer_address;
      w->rolled_back_steps = RolledBackSteps(request);
      if (w->leaving) {
        ReplyLeave(w);
        return;
      }
      TryForm();
    } else if (kind == "elastic_rendezvous") {
      OnRendezvous(w, request);
    }
  }

  // A join's "rolled_back_steps": a count (0 when absent or not one).
  static int64_t RolledBackSteps(const nlohmann::json& request) {
    const auto it = request.find("rolled_back_steps");
    if (it == request.end() || !it->is_number_integer()) return 0;
    return std::clamp<int64_t>(it->get<int64_t>(), 0, int64_t{1} << 40);
  }

  Worker* Find(const NodeKey& node) const {
    if (node.role != Role::kWorker) return nullptr;
    for (auto& w : workers_) {
      if (w->id == node.rank && w->live()) return w.get();
    }
    return nullptr;
  }

  void ReplyLeave(Worker* w) {
    auto join = std::move(w->join);
    w->join = nullptr;
    join({{"kind", "elastic_assignment"}, {"leave", true}, {"why", w->leave_why}});
  }

  // Training is over: workers that never had a rank (started on a free slot, waiting for the
  // members' next commit) will not get one. Told to leave, they exit 0 as removed workers do.
  void DismissNewcomers() {
    for (Worker* w : Live()) {
      if (w->joined || w->leaving) continue;
      w->leaving = true;
      w->leave_why = "training finished before it joined";
      Say(w->Who() + " joined no membership before training finished: it leaves");
      if (w->join) ReplyLeave(w);
    }
  }

  // Forms the next membership once every member waits in its join.
  void TryForm() {
    if (forming_ || phase() != Phase::kRunning) return;
    std::vector<Worker*> members = Members();
    std::vector<Worker*> missing;
    for (Worker* w : members) {
      if (!w->join) missing.push_back(w);
    }
    if (members.empty() || missing.size() == members.size()) return;
    if (!missing.empty()) {
      WatchJoins(missing);
      return;
    }
    if (static_cast<int>(members.size()) < elastic_.min_np) return;  // CheckEnough waits
    join_timer_.cancel();
    join_watch_ = false;
    std::sort(members.begin(), members.end(), [](Worker* a, Worker* b) { return a->id < b->id; });
    ++generation_;
    forming_ = members;
    formed_version_ = hosts_version_;
    auto join = std::move(members[0]->join);
    members[0]->join = nullptr;
    join(Assignment(0, members.size()));
  }

  nlohmann::json Assignment(int rank, size_t size) const {
    return {{"kind", "elastic_assignment"},
            {"generation", generation_},
            {"rank", rank},
            {"size", size},
            {"hosts_version", formed_version_}};
  }

  // Rank 0 of the forming membership opened the gloo rendezvous: the others may come.
  void OnRendezvous(Worker* w, const nlohmann::json& request) {
    if (!forming_ || forming_->front() != w) return;
    const auto port = request.find("port");
    if (port == request.end() || !port->is_number_integer() || port->get<int64_t>() < 1 ||
        port->get<int64_t>() > 65535) {
      Say(w->Who() + " sent a malformed rendezvous port; ignored");
      return;
    }
    std::vector<Worker*> members = std::move(*forming_);
    forming_.reset();
    broken_ = false;
    std::string ranks;
    int64_t rolled_back = 0;  // the members went back to the same commit: the most any redoes
    for (size_t r = 0; r < members.size(); ++r) {
      ranks += (r == 0 ? "" : ", ") + std::string("worker ") + std::to_string(members[r]->id);
      members[r]->joined = true;
      rolled_back = std::max(rolled_back, members[r]->rolled_back_steps);
      members[r]->rolled_back_steps = 0;
      if (r == 0) continue;
      auto answer = Assignment(static_cast<int>(r), members.size());
      answer["rendezvous_host"] = members[0]->peer_address;
      answer["rendezvous_port"] = port->get<int64_t>();
      auto join = std::move(members[r]->join);
      members[r]->join = nullptr;
      join(answer);
    }
    std::string text = "membership " + std::to_string(generation_) + ": " +
                       std::to_string(members.size()) + " rank(s): " + ranks;
    if (rolled_back > 0) {
      text += "; rolled back " + std::to_string(rolled_back) + " step(s) to their last commit";
    }
    Say(text);
    NoteReset(text);
    if (reports()) reports()->status().ForgetFailure();  // the members went on without it
  }

  // "600 s (--elastic-timeout)", for messages.
  std::string TimeoutText() const {
    return std::to_string(elastic_.timeout.count() / 1000) + " s (--elastic-timeout)";
  }

  // In the status (page, summary) and on the merged timeline.
  void NoteReset(const std::string& what) {
    if (!reports()) return;
    reports()->status().JobReset(what, NowMicros());
    reports()->MarkTimeline("elastic", what);
  }

  // Members of a broken membership must join within elastic_timeout. Those still training in an
  // intact one join at their next commit, however far: a new worker waits for them (its own
  // join has the same deadline).
  void WatchJoins(const std::vector<Worker*>& missing) {
    if (!broken_ || join_watch_) return;
    join_watch_ = true;
    join_timer_.expires_after(elastic_.timeout);
    join_timer_.async_wait([this](const asio::error_code& ec) {
      join_watch_ = false;
      if (ec || phase() != Phase::kRunning || forming_) return;
      std::vector<Worker*> late;
      for (Worker* w : Members()) {
        if (!w->join) late.push_back(w);
      }
      if (late.empty()) return;
      Say(Names(late) + " did not join the new membership within " + TimeoutText() +
          "; stopping it");
      for (Worker* w : late) ::kill(w->pid, SIGKILL);
    });
  }

  // --- exits ---

  void OnExit(WatchedProcess* p) override {
    Worker* w = static_cast<Worker*>(p);
    if (phase() != Phase::kRunning) return;
    w->join = nullptr;
    if (w->status.succeeded()) {
      w->finished = !w->leaving;
      if (!w->leaving && !finished_) {
        finished_ = true;
        Say(w->Who() + " finished; the job ends when the others do");
        DismissNewcomers();
      }
    } else {
      OnFailure(w);
      if (phase() != Phase::kRunning) return;
    }
    if (Live().empty()) {
      if (finished_) {
        WaitForServices();  // no services: the job ends with 0
      } else {
        Say("no worker is left; stopping the job");
        set_exit_code(1);
        BeginStop();
      }
      return;
    }
    if (forming_ && std::find(forming_->begin(), forming_->end(), w) != forming_->end()) {
      // It was in the membership being formed: form again without it. Those already answered
      // fail their rendezvous and join again.
      for (Worker* m : *forming_) {
        if (m != w && m->join == nullptr && m->live()) broken_ = true;
      }
      forming_.reset();
    }
    if (!finished_) {
      CheckEnough();
      TryForm();
    }
  }

  void OnFailure(Worker* w) {
    // A leaving worker's host was dropped: its slots count afresh if the host comes back.
    if (!w->leaving) ++retired_[w->slot];
    ++hosts_version_;
    broken_ = true;
    const std::vector<Worker*> members = Members();
    if (members.empty() && !finished_) {
      Say(w->Who() + " " + DescribeExit(w->spec, w->status) +
          "; every worker has failed, nobody holds the training state: stopping the job");
      set_exit_code(w->status.ShellCode());
      BeginStop();
      return;
    }
    Say(w->Who() + " " + DescribeExit(w->spec, w->status) + "; its slot on " + w->slot +
        " is retired and the other " + std::to_string(members.size()) +
        " go on from their last commit");
    NoteReset(w->Who() + " " + DescribeExit(w->spec, w->status) + ": slot retired");
  }

  void SignalStop() override {
    discovery_timer_.cancel();
    below_min_timer_.cancel();
    join_timer_.cancel();
    JobWatch::SignalStop();
  }

  ProcessSpec template_;
  ElasticOptions elastic_;
  asio::steady_timer discovery_timer_;
  asio::steady_timer below_min_timer_;
  asio::steady_timer join_timer_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::map<std::string, int> slots_;      // host -> slots, as last discovered
  std::vector<std::string> hosts_order_;  // in the script's order
  std::map<std::string, int> retired_;    // host -> slots whose worker failed
  std::set<std::string> refused_hosts_;
  std::string last_discovery_error_;
  std::optional<std::vector<Worker*>> forming_;  // by rank; rank 0 answered, the rest wait
  int next_id_ = 0;
  int generation_ = 0;
  int64_t hosts_version_ = 0;   // changes whenever workers come or go
  int64_t formed_version_ = 0;  // hosts_version_ when the last membership formed
  int64_t added_version_ = 0;   // hosts_version_ when the last worker was added
  bool ever_started_ = false;
  bool below_min_ = false;
  bool join_watch_ = false;
  bool broken_ = false;    // a member failed since the last membership formed
  bool finished_ = false;  // a worker exited 0: training is over
};

}  // namespace

int SuperviseElasticJob(const ProcessSpec& worker, const SupervisorOptions& options,
                        const ElasticOptions& elastic) {
  return ElasticSupervisor(worker, options, elastic).Run();
}

}  // namespace dtrain::launcher
