#include "ps/scheduler.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "common/logging.h"
#include "dtrain/common/error.h"
#include "ps/node/control.h"
#include "ps/node/listen_address.h"
#include "ps/node/node_info.h"
#include "report/reporter.h"

namespace dtrain::ps {

using transport::Command;
using transport::Message;

namespace {

// What transport threads hand to the scheduler's thread.
struct Event {
  bool lost = false;
  Message msg;
  NodeId peer = transport::kNoNode;
  std::string remote;
  std::string reason;
};

class EventQueue {
 public:
  void Push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  std::optional<Event> PopUntil(Clock::time_point until) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_until(lock, until, [this] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

enum class Phase { kRegistering, kStarting, kRunning, kDone };

constexpr NodeId kRefusedLink = 1 << 30;

// How long a worker that registers while the job runs is held for a loss it could replace: far
// longer than the scheduler takes to see a dead process, short enough for a stray worker.
constexpr Duration kHoldRegistration{5000};

// A member lost while the job waits for replacements (DTRAIN_RESTART_WAIT_MS).
struct Vacancy {
  Clock::time_point since;  // when it was lost
  std::string why;          // how it was lost
};

// A replacement that has registered and is connecting to the servers.
struct Rejoining {
  Vacancy vacancy;
  bool ready = false;            // it has connected to every peer
  std::set<NodeId> peers_ready;  // peers (servers of a worker, workers of a server) connected
  // Its node table waits for a lost peer's replacement: the lost process's address would have it
  // try to connect to nobody until its connect timeout.
  bool table_pending = false;
};

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

struct Scheduler::State {
  State(const Config& c, std::unique_ptr<transport::Transport> t)
      : config(c), transport(std::move(t)) {
    layout.num_servers = c.num_servers;
    layout.num_workers = c.num_workers;
  }

  Config config;
  std::unique_ptr<transport::Transport> transport;
  JobLayout layout;
  EventQueue events;
  Phase phase = Phase::kRegistering;
  std::vector<control::Registration> registrations;
  std::vector<NodeInfo> table;
  std::set<NodeId> ready;
  std::set<NodeId> finished;
  std::map<Group, std::set<NodeId>> barrier_arrivals;
  std::map<Group, std::string> barrier_meta;
  std::map<NodeId, Clock::time_point> last_heard;
  std::optional<int> exit_code;
  std::map<Group, uint64_t> barriers_completed;
  uint64_t setup_barriers_completed = 0;  // of the workers' group (control.h's EncodeBarrier)
  std::map<NodeId, Vacancy> vacant;
  std::map<NodeId, Rejoining> rejoining;
  std::vector<std::pair<control::Registration, Clock::time_point>> held;

  bool Replaceable(NodeId id) const {
    return phase == Phase::kRunning && finished.count(id) == 0 &&
           ((layout.IsWorker(id) && config.restart_wait.count() > 0) ||
            (layout.IsServer(id) && config.ServersReplaceable()));
  }

  bool RoleReplaceable(Role role) const {
    return role == Role::kWorker ? config.restart_wait.count() > 0 : config.ServersReplaceable();
  }

  // The peers a member of `role` talks to, who connect to its replacement.
  static Role PeerRole(Role role) { return role == Role::kWorker ? Role::kServer : Role::kWorker; }
  NodeId IdOf(Role role, int rank) const {
    return role == Role::kServer ? layout.ServerId(rank) : layout.WorkerId(rank);
  }

  // A server or worker of the job's table (the scheduler assigns it once every place is taken).
  bool IsMember(NodeId id) const { return id > 0 && static_cast<size_t>(id) < table.size(); }

  // How the launcher's records name a member (job_status.h).
  nlohmann::json ReportedNode(NodeId id) const {
    return {{"role", RoleName(layout.RoleOf(id))},
            {"rank", layout.RankOf(id)},
            {"host", table[id].host}};
  }

  std::string Name(NodeId id) const {
    if (id >= 0 && static_cast<size_t>(id) < table.size()) return table[id].Name();
    return id == transport::kNoNode ? "an unidentified node" : "node " + std::to_string(id);
  }

  void SendTo(NodeId id, Command command, std::string meta = {}) {
    Message msg;
    msg.header.command = command;
    msg.header.sender = transport::kSchedulerId;
    msg.header.recipient = id;
    msg.meta = std::move(meta);
    try {
      transport->Send(id, std::move(msg));
    } catch (const Error& e) {
      DTRAIN_LOG(kWarning) << "could not send " << transport::CommandName(command) << " to "
                           << Name(id) << ": " << e.what();
    }
  }

  int Count(Role role) const {
    return static_cast<int>(std::count_if(registrations.begin(), registrations.end(),
                                          [role](const auto& r) { return r.role == role; }));
  }
  int Expected(Role role) const {
    return role == Role::kServer ? layout.num_servers : layout.num_workers;
  }

  // Tells a node that could not join why, then forgets it.
  void Refuse(const control::Registration& reg, const std::string& why) {
    DTRAIN_LOG(kWarning) << "refusing " << RoleName(reg.role) << " at " << reg.host << ":"
                         << reg.port << ": " << why;
    const NodeId temp = kRefusedLink;  // outside the job's ids: its loss is never a member's
    try {
      transport->Connect(temp, {reg.host, reg.port}, transport::kSchedulerId,
                         Deadline(Duration(2000)));
      SendTo(temp, Command::kAbort, why);
    } catch (const Error&) {
    }
  }

  void OnRegister(const Message& msg) {
    control::Registration reg;
    try {
      reg = control::DecodeRegistration(msg.meta);
    } catch (const ProtocolError& e) {
      DTRAIN_LOG(kWarning) << "ignoring a bad registration: " << e.what();
      return;
    }
    if (reg.role == Role::kScheduler) return Refuse(reg, "a job has only one scheduler");
    if (phase == Phase::kRunning && reg.role != Role::kScheduler && RoleReplaceable(reg.role)) {
      if (VacancyFor(reg) != vacant.end()) return TakeVacancy(reg);
      // A replacement can register before the loss of the process it replaces is seen here (the
      // launcher sees the exit first): held until a member is lost, or refused after a while.
      DTRAIN_LOG(kConnections) << "holding the registration of a " << RoleName(reg.role) << " at "
                               << reg.host << ":" << reg.port << " until a " << RoleName(reg.role)
                               << " of its rank is lost";
      held.emplace_back(reg, Clock::now());
      return;
    }
    if (phase != Phase::kRegistering || Count(reg.role) >= Expected(reg.role)) {
      return Refuse(reg, "the job already has its " + std::to_string(Expected(reg.role)) + " " +
                             RoleName(reg.role) + "(s) (DMLC_NUM_" +
                             (reg.role == Role::kServer ? "SERVER" : "WORKER") + ")");
    }
    DTRAIN_LOG(kConnections) << RoleName(reg.role) << " registered from " << reg.host << ":"
                             << reg.port;
    registrations.push_back(reg);
    if (Count(Role::kServer) == layout.num_servers && Count(Role::kWorker) == layout.num_workers) {
      AssignAndAnnounce();
    }
  }

  // Ranks: the requested ones if they are a permutation of 0..n-1, else arrival order.
  std::vector<int> RanksFor(Role role) const {
    std::vector<int> requested;
    for (const auto& r : registrations) {
      if (r.role == role) requested.push_back(r.requested_rank);
    }
    std::vector<int> sorted = requested;
    std::sort(sorted.begin(), sorted.end());
    bool permutation = true;
    for (size_t i = 0; i < sorted.size(); ++i) permutation &= sorted[i] == static_cast<int>(i);
    if (permutation) return requested;
    std::vector<int> arrival(requested.size());
    for (size_t i = 0; i < arrival.size(); ++i) arrival[i] = static_cast<int>(i);
    return arrival;
  }

  void AssignAndAnnounce() {
    table.assign(layout.NumNodes(), NodeInfo{});
    table[0] = NodeInfo{0, Role::kScheduler, 0, config.scheduler_host, config.scheduler_port};
    for (Role role : {Role::kServer, Role::kWorker}) {
      auto ranks = RanksFor(role);
      size_t i = 0;
      for (const auto& r : registrations) {
        if (r.role != role) continue;
        const int rank = ranks[i++];
        const NodeId id = role == Role::kServer ? layout.ServerId(rank) : layout.WorkerId(rank);
        table[id] = NodeInfo{id, role, rank, r.host, r.port};
      }
    }
    const std::string encoded = control::EncodeNodeTable(table);
    for (size_t id = 1; id < table.size(); ++id) {
      const NodeInfo& n = table[id];
      DTRAIN_LOG(kConnections) << "assigned " << n.Name();
      try {
        transport->Connect(n.id, {n.host, n.port}, transport::kSchedulerId,
                           Deadline(config.connect_timeout));
      } catch (const Error& e) {
        return FailJob(n.id, std::string("the scheduler cannot reach the address it announced: ") +
                                 e.what() + " (see DMLC_INTERFACE / DMLC_NODE_HOST)");
      }
      SendTo(n.id, Command::kNodeTable, encoded);
    }
    phase = Phase::kStarting;
  }

  // A lost worker's id: the job waits for a replacement instead of failing.
  // `silent_ms`: it was lost by its silence that long (its process may still run), not by a
  // closed connection; the launcher kills such a process before it replaces it.
  void Vacate(NodeId id, const std::string& reason, int64_t silent_ms = 0) {
    Vacancy v{Clock::now(), reason};
    if (auto it = rejoining.find(id); it != rejoining.end()) {
      v.since = it->second.vacancy.since;  // a replacement lost while joining: the same wait
      rejoining.erase(it);
    }
    DTRAIN_LOG(kWarning) << Name(id) << " was lost: " << reason << "; waiting up to "
                         << Seconds(config.restart_wait)
                         << " s for a replacement with its rank (DTRAIN_RESTART_WAIT_MS)";
    nlohmann::json lost{{"kind", "member_lost"}, {"node", ReportedNode(id)}, {"cause", reason}};
    if (silent_ms > 0) lost["silent_ms"] = silent_ms;
    report::Send(lost);
    last_heard.erase(id);
    for (auto& [group, arrived] : barrier_arrivals) arrived.erase(id);
    vacant.emplace(id, std::move(v));
    for (auto h = held.begin(); h != held.end(); ++h) {
      if (VacancyFor(h->first) != vacant.end()) {
        const control::Registration reg = h->first;
        held.erase(h);
        return TakeVacancy(reg);
      }
    }
  }

  // Held registrations whose rank's worker was not lost within kHoldRegistration are refused.
  void RefuseHeldTooLong() {
    const auto now = Clock::now();
    std::vector<control::Registration> refused;
    std::erase_if(held, [&](const auto& h) {
      if (now - h.second < kHoldRegistration) return false;
      refused.push_back(h.first);
      return true;
    });
    for (const auto& reg : refused) {
      const bool server = reg.role == Role::kServer;
      Refuse(reg, "the job already has its " + std::to_string(Expected(reg.role)) + " " +
                      RoleName(reg.role) + "(s) (DMLC_NUM_" + (server ? "SERVER" : "WORKER") +
                      "), and none of them was lost within " +
                      std::to_string(kHoldRegistration.count() / 1000) +
                      " s for this one to replace");
    }
  }

  // The first vacancy of `role`, or vacant.end().
  std::map<NodeId, Vacancy>::iterator VacancyOf(Role role) {
    return std::find_if(vacant.begin(), vacant.end(),
                        [&](const auto& v) { return layout.RoleOf(v.first) == role; });
  }

  std::map<NodeId, Vacancy>::iterator VacancyFor(const control::Registration& reg) {
    if (reg.requested_rank < 0) return VacancyOf(reg.role);
    if (reg.requested_rank >= Expected(reg.role)) return vacant.end();
    return vacant.find(IdOf(reg.role, reg.requested_rank));
  }

  void TakeVacancy(const control::Registration& reg) {
    auto it = VacancyFor(reg);
    if (it == vacant.end()) {
      return Refuse(reg, "the job is running and " + std::string(RoleName(reg.role)) + " " +
                             std::to_string(reg.requested_rank) +
                             " (DTRAIN_NODE_RANK) is not lost: only a lost member's rank can be "
                             "taken by a replacement");
    }
    const NodeId id = it->first;
    Rejoining r{std::move(it->second), false, {}};
    vacant.erase(it);
    table[id] = NodeInfo{id, reg.role, layout.RankOf(id), reg.host, reg.port};
    DTRAIN_LOG(kConnections) << "a replacement for " << RoleName(reg.role) << " "
                             << layout.RankOf(id) << " registered from " << reg.host << ":"
                             << reg.port << ", " << SecondsSince(r.vacancy.since)
                             << " s after it was lost";
    transport->ForgetPeer(id);
    try {
      transport->Connect(id, {reg.host, reg.port}, transport::kSchedulerId,
                         Deadline(config.connect_timeout));
    } catch (const Error& e) {
      DTRAIN_LOG(kWarning) << "cannot reach the replacement at " << reg.host << ":" << reg.port
                           << ": " << e.what();
      vacant.emplace(id, std::move(r.vacancy));
      return;
    }
    last_heard[id] = Clock::now();
    const bool peer_vacant = VacancyOf(PeerRole(reg.role)) != vacant.end();
    r.table_pending = peer_vacant;
    rejoining.emplace(id, std::move(r));
    if (peer_vacant) {
      DTRAIN_LOG(kConnections) << "the replacement of " << table[id].Name()
                               << " gets the node table once the lost "
                               << RoleName(PeerRole(reg.role)) << "(s) are replaced as well";
    } else {
      SendNodeTable(id);
    }
    // Replacements of peers that waited for this one get the table now (before they hear of it).
    if (VacancyOf(reg.role) == vacant.end()) {
      for (auto& [peer, waiting] : rejoining) {
        if (waiting.table_pending && layout.RoleOf(peer) == PeerRole(reg.role)) {
          waiting.table_pending = false;
          SendNodeTable(peer);
        }
      }
    }
    // A peer's replacement that is still rejoining waits until every member of this role has
    // reached it (StartReplacement), this one included: its lost process never will.
    for (const auto& [peer, waiting] : rejoining) {
      if (layout.RoleOf(peer) == PeerRole(reg.role)) {
        SendTo(id, Command::kNodeReplaced, control::EncodeNodeTable({table[peer]}));
      }
    }
    const std::string replacement = control::EncodeNodeTable({table[id]});
    for (NodeId peer : Peers(reg.role)) SendTo(peer, Command::kNodeReplaced, replacement);
  }

  void SendNodeTable(NodeId id) {
    SendTo(id, Command::kRejoin,
           control::EncodeRejoin({barriers_completed[Group::kWorkers],
                                  barriers_completed[Group::kAll], setup_barriers_completed}));
    SendTo(id, Command::kNodeTable, control::EncodeNodeTable(table));
  }

  std::vector<NodeId> Peers(Role role) const {
    std::vector<NodeId> out;
    const Role peer = PeerRole(role);
    for (int r = 0; r < Expected(peer); ++r) out.push_back(IdOf(peer, r));
    return out;
  }

  void OnReplacedReady(NodeId peer, const std::string& meta) {
    const NodeId id = static_cast<NodeId>(std::strtol(meta.c_str(), nullptr, 10));
    auto it = rejoining.find(id);
    if (it == rejoining.end() || !IsMember(peer) ||
        layout.RoleOf(peer) != PeerRole(layout.RoleOf(id))) {
      return;
    }
    it->second.peers_ready.insert(peer);
    StartReplacement(id);
  }

  // Every peer reaches the replacement and it reaches them: it may send its first request (a
  // worker), or be sent requests (a server: the workers are told it started).
  void StartReplacement(NodeId id) {
    auto it = rejoining.find(id);
    const Role role = layout.RoleOf(id);
    if (it == rejoining.end() || !it->second.ready ||
        static_cast<int>(it->second.peers_ready.size()) < Expected(PeerRole(role))) {
      return;
    }
    const double after = SecondsSince(it->second.vacancy.since);
    rejoining.erase(it);
    last_heard[id] = Clock::now();
    SendTo(id, Command::kStart);
    if (role == Role::kServer) {
      for (NodeId w : Peers(role)) SendTo(w, Command::kReplacementStarted, std::to_string(id));
    }
    DTRAIN_LOG(kWarning) << table[id].Name() << " rejoined the job " << after
                         << " s after it was lost (a replacement, DTRAIN_RESTART_WAIT_MS)";
    report::Send({{"kind", "member_rejoined"}, {"node", ReportedNode(id)}, {"seconds", after}});
  }

  void OnReady(NodeId id) {
    if (auto it = rejoining.find(id); it != rejoining.end()) {
      it->second.ready = true;
      return StartReplacement(id);
    }
    if (!layout.IsServer(id) && !layout.IsWorker(id)) return;
    ready.insert(id);
    if (static_cast<int>(ready.size()) == layout.NumNodes() - 1 && phase == Phase::kStarting) {
      phase = Phase::kRunning;
      const auto now = Clock::now();
      for (NodeId n : ready) last_heard[n] = now;
      for (NodeId n : ready) SendTo(n, Command::kStart);
      DTRAIN_LOG(kConnections) << "all " << ready.size() << " nodes are ready; job started";
    }
  }

  void OnBarrier(const Message& msg) {
    const NodeId from = msg.header.sender;
    const auto [group, seq, setup] = control::DecodeBarrier(msg.meta);
    auto& arrived = barrier_arrivals[group];
    arrived.insert(from);
    barrier_meta[group] = msg.meta;
    int members = 0;
    for (size_t id = 1; id < table.size(); ++id) members += InGroup(group, table[id].role);
    if (static_cast<int>(arrived.size()) < members) {
      BarrierBlockedByFinished();
      return;
    }
    for (NodeId n : arrived) SendTo(n, Command::kBarrierDone, barrier_meta[group]);
    arrived.clear();
    ++barriers_completed[group];
    if (group == Group::kWorkers && setup) ++setup_barriers_completed;
  }

  // A barrier that waits for a worker that has already left the job can never complete: fail it
  // loudly instead of letting the others wait for their deadline.
  bool BarrierBlockedByFinished() {
    for (auto& [group, arrived] : barrier_arrivals) {
      if (arrived.empty()) continue;
      for (NodeId f : finished) {
        if (InGroup(group, table[f].role) && arrived.count(f) == 0) {
          FailJob(f, std::string("it finished the job while the others wait at a barrier of ") +
                         GroupName(group) + " (do all workers run the same number of steps?)");
          return true;
        }
      }
    }
    return false;
  }

  void OnFinish(NodeId id) {
    if (!layout.IsWorker(id)) return;
    finished.insert(id);
    if (BarrierBlockedByFinished()) return;
    if (static_cast<int>(finished.size()) < layout.num_workers) {
      // Servers must stop waiting for this worker's pushes in dist_sync rounds.
      for (int s = 0; s < layout.num_servers; ++s) {
        SendTo(layout.ServerId(s), Command::kFinish, std::to_string(id));
      }
      return;
    }
    DTRAIN_LOG(kConnections) << "every worker finished; ending the job";
    for (size_t id2 = 1; id2 < table.size(); ++id2)
      SendTo(static_cast<NodeId>(id2), Command::kTerminate);
    phase = Phase::kDone;
    exit_code = 0;
  }

  void FailJob(NodeId id, const std::string& reason) {
    const std::string name = Name(id);
    DTRAIN_LOG(kError) << name << " failed: " << reason << "; stopping the job";
    // The launcher names the failed node from this record, not from the line above.
    if (id >= 0 && static_cast<size_t>(id) < table.size()) {
      report::Send({{"kind", "failure"}, {"node", ReportedNode(id)}, {"cause", reason}});
    }
    control::Failure f{id, name, reason};
    const std::string encoded = control::EncodeFailure(f);
    for (size_t other = 1; other < table.size(); ++other) {
      const NodeId n = static_cast<NodeId>(other);
      if (!transport->IsConnected(n)) continue;
      if (n == id) {
        // It may be alive (e.g. it finished early): tell it why the job stops.
        SendTo(n, Command::kAbort, "because of this node: " + reason);
      } else {
        SendTo(n, Command::kNodeFailed, encoded);
      }
    }
    phase = Phase::kDone;
    exit_code = 1;
  }

  void Handle(Event& e) {
    if (e.lost) {
      if (phase == Phase::kDone || finished.count(e.peer) != 0) return;
      if (e.peer == transport::kNoNode) {
        // Not a member (or one not yet registered): members are watched on the scheduler's own
        // link to each of them, which carries their id, and by their heartbeats.
        DTRAIN_LOG(kWarning) << "a connection from " << e.remote
                             << " closed before its node joined: " << e.reason;
        return;
      }
      if (!IsMember(e.peer)) {
        // The link that told a refused node why (Refuse): that node leaves, as it should.
        DTRAIN_LOG(kConnections) << "a refused node at " << e.remote << " left: " << e.reason;
        return;
      }
      if (vacant.count(e.peer) != 0) return;  // its other links, closing later
      if (Replaceable(e.peer)) return Vacate(e.peer, e.reason);
      return FailJob(e.peer, e.reason);
    }
    const Message& msg = e.msg;
    const NodeId from = msg.header.sender;
    // A lost member that was only silent (CheckHeartbeats) may still speak: it is no member
    // until its replacement takes the rank.
    if (vacant.count(from) != 0) return;
    if (from >= 0) last_heard[from] = Clock::now();
    switch (msg.header.command) {
      case Command::kRegister:
        return OnRegister(msg);
      case Command::kReady:
        return OnReady(from);
      case Command::kBarrier:
        return OnBarrier(msg);
      case Command::kHeartbeat:
        if (from > 0 && static_cast<size_t>(from) < table.size()) SendTo(from, Command::kHeartbeat);
        return;
      case Command::kFinish:
        return OnFinish(from);
      case Command::kReplacedReady:
        return OnReplacedReady(from, msg.meta);
      default:
        DTRAIN_LOG(kWarning) << "scheduler ignores " << transport::CommandName(msg.header.command)
                             << " from " << Name(from);
    }
  }

  void CheckHeartbeats() {
    if (phase != Phase::kRunning) return;
    const auto now = Clock::now();
    RefuseHeldTooLong();
    for (auto& [id, v] : vacant) {
      if (now - v.since > config.restart_wait) return FailUnreplaced(id, v);
    }
    for (auto& [id, r] : rejoining) {
      if (now - r.vacancy.since > config.restart_wait) return FailUnreplaced(id, r.vacancy);
    }
    std::vector<NodeId> silent;
    for (auto& [id, when] : last_heard) {
      if (finished.count(id) == 0 && now - when > config.heartbeat_timeout) silent.push_back(id);
    }
    const std::string why = "sent no heartbeat for " +
                            std::to_string(config.heartbeat_timeout.count()) +
                            " ms (PS_HEARTBEAT_TIMEOUT): its host may be down or cut off";
    for (NodeId id : silent) {
      // A member cut off (a link down, a stopped process) is lost like a dead one: with restarts
      // the job waits for its replacement, which the launcher starts once it has stopped the
      // silent process (its "member_lost" record; issue 63's link cuts).
      if (!Replaceable(id)) return FailJob(id, why);
      // It may come back (a stopped process continued, a link up again): it must leave, not
      // act beside its replacement. Queued now, this reaches it before anything else does.
      if (transport->IsConnected(id)) {
        SendTo(id, Command::kAbort, "this node was lost (" + why + ") and is being replaced");
      }
      Vacate(id, why, config.heartbeat_timeout.count());
    }
  }

  void FailUnreplaced(NodeId id, const Vacancy& v) {
    const std::string why = "it was lost (" + v.why + ") and no replacement " +
                            (rejoining.count(id) ? "finished joining" : "registered") + " within " +
                            std::to_string(Seconds(config.restart_wait)) +
                            " s (DTRAIN_RESTART_WAIT_MS)";
    vacant.clear();
    rejoining.clear();
    FailJob(id, why);
  }

  void FailStart() {
    const std::string why =
        "the job did not start within " + std::to_string(Seconds(config.start_timeout)) +
        " s (DTRAIN_START_TIMEOUT_MS): " +
        (phase == Phase::kRegistering
             ? std::to_string(Count(Role::kServer)) + " of " + std::to_string(layout.num_servers) +
                   " servers and " + std::to_string(Count(Role::kWorker)) + " of " +
                   std::to_string(layout.num_workers) + " workers registered"
             : std::to_string(ready.size()) + " of " + std::to_string(layout.NumNodes() - 1) +
                   " nodes connected to their peers");
    DTRAIN_LOG(kError) << why;
    if (phase == Phase::kRegistering) {
      for (const auto& r : registrations) Refuse(r, why);
    } else {
      for (size_t id = 1; id < table.size(); ++id)
        SendTo(static_cast<NodeId>(id), Command::kAbort, why);
    }
    phase = Phase::kDone;
    exit_code = 1;
  }
};

Scheduler::Scheduler(const Config& config, std::unique_ptr<transport::Transport> transport)
    : state_(std::make_unique<State>(config, std::move(transport))) {
  State* s = state_.get();
  s->transport->SetHandlers(
      [s](Message&& msg) {
        s->events.Push(Event{false, std::move(msg), transport::kNoNode, {}, {}});
      },
      [s](NodeId peer, const std::string& remote, const std::string& reason) {
        s->events.Push(Event{true, Message{}, peer, remote, reason});
      });
}

Scheduler::~Scheduler() { state_->transport->Shutdown(Deadline(Duration(3000))); }

uint16_t Scheduler::Listen() {
  const uint16_t port = ListenForJob(*state_->transport, state_->config,
                                     state_->config.scheduler_host, state_->config.scheduler_port);
  state_->config.scheduler_port = port;
  DTRAIN_LOG(kConnections) << "scheduler listening on port " << port << " for "
                           << state_->layout.num_servers << " server(s) and "
                           << state_->layout.num_workers
                           << " worker(s); configuration: " << state_->config.Describe();
  return port;
}

int Scheduler::Run() {
  State& s = *state_;
  SetLogIdentity("scheduler");
  report::SetIdentity("scheduler", 0, s.config.scheduler_host);
  report::Send({{"kind", "state"}, {"state", "running"}});
  const Deadline start_deadline(s.config.start_timeout);
  // The deadlines are checked on time even while events keep coming (every node's heartbeats):
  // a busy scheduler must still notice a node gone silent, or a start that never completes.
  Clock::time_point next_check = Clock::now() + s.config.heartbeat_interval;
  while (!s.exit_code) {
    Clock::time_point until = next_check;
    if (s.phase == Phase::kRegistering || s.phase == Phase::kStarting) {
      until = std::min(until, start_deadline.at());
    }
    auto event = s.events.PopUntil(until);
    if (event) {
      try {
        s.Handle(*event);
      } catch (const ProtocolError& e) {
        DTRAIN_LOG(kWarning) << "ignoring a malformed message from "
                             << s.Name(event->msg.header.sender) << ": " << e.what();
      }
      if (s.exit_code || Clock::now() < until) continue;
    }
    if ((s.phase == Phase::kRegistering || s.phase == Phase::kStarting) &&
        start_deadline.passed()) {
      s.FailStart();
    } else if (Clock::now() >= next_check) {
      s.CheckHeartbeats();
      next_check = Clock::now() + s.config.heartbeat_interval;
    }
  }
  s.transport->Shutdown(Deadline(Duration(3000)));
  return *s.exit_code;
}

}  // namespace dtrain::ps
