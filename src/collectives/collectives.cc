// The process-wide API of collectives.h: one Communicator and one Engine for the job, made by Init,
// and the process sets' (process_sets.h).
#include "dtrain/collectives/collectives.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "collectives/backend.h"
#include "collectives/collectives_internal.h"
#include "collectives/config.h"
#include "collectives/elastic/elastic_membership.h"
#include "collectives/engine/engine.h"
#include "collectives/nccl/device_communicator.h"
#include "collectives/process_sets.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

std::mutex g_mutex;
std::shared_ptr<Communicator> g_backend;  // guarded by g_mutex, as is g_engine
std::shared_ptr<Engine> g_engine;
std::shared_ptr<ProcessSetTable> g_sets;

void CheckInitialized() {
  if (!g_engine) throw InvalidArgument("dtrain::collectives::Init() has not been called");
}

std::shared_ptr<Engine> TheEngine() {
  std::lock_guard<std::mutex> lock(g_mutex);
  CheckInitialized();
  return g_engine;
}

std::shared_ptr<ProcessSetTable> TheSets() {
  std::lock_guard<std::mutex> lock(g_mutex);
  CheckInitialized();
  return g_sets;
}

std::shared_ptr<Engine> EngineOf(int process_set) {
  return process_set == kGlobalProcessSet ? TheEngine() : TheSets()->EngineOf(process_set);
}

}  // namespace

void Init() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_engine) return;
  CollectivesConfig config = CollectivesConfig::FromEnvironment();
  if (config.verbose > LogVerbosity()) SetLogVerbosity(config.verbose);
  std::unique_ptr<RendezvousServer> rendezvous;
  if (config.elastic) {
    ElasticPlace place = JoinElasticMembership(config);
    config.rank = place.rank;
    config.size = place.size;
    config.rendezvous_host = place.rendezvous_host;
    config.rendezvous_port = place.rendezvous_port;
    rendezvous = std::move(place.server);
  }
  DTRAIN_LOG(kConnections) << "collectives: " << config.Describe();
  auto backend = std::shared_ptr<Communicator>(
      config.elastic ? CreateGlooBackend(config, std::move(rendezvous)) : CreateBackend(config));
  config.spin_wait = SpinWaitFor(config, *backend);  // the world's ranks per host decide
  g_engine = std::make_shared<Engine>(backend, config);
  g_sets = std::make_shared<ProcessSetTable>(g_engine, backend, config);
  g_backend = std::move(backend);
  static bool at_exit = false;
  if (!at_exit) {
    at_exit = true;
    std::atexit([] { Shutdown(); });
  }
}

void Shutdown() {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<Communicator> backend;
  std::shared_ptr<ProcessSetTable> sets;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    engine = std::move(g_engine);
    backend = std::move(g_backend);
    sets = std::move(g_sets);
  }
  // The sets' communicators lean on the job's (its rendezvous, its MPI): they go first.
  if (sets) sets->ShutdownAll();
  if (engine) engine->Shutdown();
}

bool IsElastic() { return ProcessConfig().allreduce.elastic; }

HostsUpdate ElasticHostsUpdate(Duration timeout) {
  return IsElastic() ? AskLauncherHostsUpdate(timeout) : HostsUpdate::kNone;
}

void NoteElasticRollback(int64_t steps) {
  if (IsElastic()) NoteRolledBackSteps(steps);
}

bool IsInitialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_engine != nullptr;
}

BackendKind Backend() { return TheEngine()->backend().kind(); }
int Rank() { return TheEngine()->backend().rank(); }
int Size() { return TheEngine()->backend().size(); }
int LocalRank() { return TheEngine()->backend().local_rank(); }
int LocalSize() { return TheEngine()->backend().local_size(); }
bool NcclEnabled() { return TheEngine()->nccl_enabled(); }

int AddProcessSet(const std::vector<int>& ranks) { return TheSets()->Add(ranks); }
bool RemoveProcessSet(int process_set) { return TheSets()->Remove(process_set); }
std::vector<int> ProcessSetRanks(int process_set) { return TheSets()->Ranks(process_set); }
std::vector<int> ProcessSetIds() { return TheSets()->Ids(); }

Handle AllreduceAsync(const std::string& name, const Array& in, const Array& out, ReduceOp op,
                      int priority, int process_set) {
  return EngineOf(process_set)->Allreduce(name, in, out, op, priority);
}
Handle AllgatherAsync(const std::string& name, const Array& in, int process_set) {
  return EngineOf(process_set)->Allgather(name, in);
}
Handle BroadcastAsync(const std::string& name, const Array& inout, int root, int process_set) {
  return EngineOf(process_set)->Broadcast(name, inout, root);
}
Handle AlltoallAsync(const std::string& name, const Array& in, const std::vector<int64_t>& splits,
                     int process_set) {
  return EngineOf(process_set)->Alltoall(name, in, splits);
}
Handle ReducescatterAsync(const std::string& name, const Array& in, ReduceOp op, int process_set) {
  return EngineOf(process_set)->Reducescatter(name, in, op);
}
Handle BarrierAsync(int process_set) { return EngineOf(process_set)->Barrier(); }
void RefuseName(const std::string& name, int process_set) { EngineOf(process_set)->Refuse(name); }

SubmittedTogether::SubmittedTogether(int process_set) {
  std::shared_ptr<Engine> engine = EngineOf(process_set);
  engine->HoldRounds();
  release_ = [engine] { engine->ReleaseRounds(); };
}
SubmittedTogether::~SubmittedTogether() { release(); }
void SubmittedTogether::release() {
  if (release_) std::exchange(release_, nullptr)();
}

void Allreduce(const std::string& name, const Array& in, const Array& out, ReduceOp op) {
  AllreduceAsync(name, in, out, op).Wait();
}
Array Allgather(const std::string& name, const Array& in) {
  Handle h = AllgatherAsync(name, in);
  h.Wait();
  return h.result();
}
void Broadcast(const std::string& name, const Array& inout, int root) {
  BroadcastAsync(name, inout, root).Wait();
}
void BroadcastBytes(const std::string& name, std::string& bytes, int root) {
  Array length(Shape{1}, DType::kFloat64);  // exact up to 2^53 bytes
  *static_cast<double*>(length.data()) = static_cast<double>(bytes.size());
  Broadcast(name + ".length", length, root);
  const auto size = static_cast<size_t>(*static_cast<const double*>(length.data()));
  if (size == 0) {
    bytes.clear();
    return;
  }
  Array data(Shape{static_cast<int64_t>((size + 3) / 4)}, DType::kFloat32);
  if (Rank() == root) std::memcpy(data.data(), bytes.data(), size);
  Broadcast(name, data, root);
  bytes.assign(data.bytes(), size);
}
void Barrier(int process_set) { BarrierAsync(process_set).Wait(); }

Handle JoinAsync() { return TheEngine()->Join(); }
int Join() {
  Handle h = JoinAsync();
  h.Wait();
  return static_cast<int>(h.result().floats()[0]);
}

EngineStats Stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_engine ? g_engine->stats() : EngineStats{};
}

}  // namespace dtrain::collectives
