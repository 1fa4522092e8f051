// The process-wide API of collectives.h: one Communicator and one Engine, made by Init.
#include "dtrain/collectives/collectives.h"

#include <cstdlib>
#include <mutex>

#include "collectives/backend.h"
#include "collectives/config.h"
#include "collectives/engine/engine.h"
#include "collectives/nccl/device_communicator.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

std::mutex g_mutex;
std::shared_ptr<Communicator> g_backend;  // guarded by g_mutex, as is g_engine
std::shared_ptr<Engine> g_engine;

std::shared_ptr<Engine> TheEngine() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine) throw InvalidArgument("dtrain::collectives::Init() has not been called");
  return g_engine;
}

}  // namespace

void Init() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_engine) return;
  const CollectivesConfig config = CollectivesConfig::FromEnvironment();
  if (config.verbose > LogVerbosity()) SetLogVerbosity(config.verbose);
  DTRAIN_LOG(kConnections) << "collectives: " << config.Describe();
  auto backend = std::shared_ptr<Communicator>(CreateBackend(config));
  g_engine = std::make_shared<Engine>(backend, config);
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
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    engine = std::move(g_engine);
    backend = std::move(g_backend);
  }
  if (engine) engine->Shutdown();
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

Handle AllreduceAsync(const std::string& name, const Array& in, const Array& out, ReduceOp op,
                      int priority) {
  return TheEngine()->Allreduce(name, in, out, op, priority);
}
Handle AllgatherAsync(const std::string& name, const Array& in) {
  return TheEngine()->Allgather(name, in);
}
Handle BroadcastAsync(const std::string& name, const Array& inout, int root) {
  return TheEngine()->Broadcast(name, inout, root);
}
Handle AlltoallAsync(const std::string& name, const Array& in, const std::vector<int64_t>& splits) {
  return TheEngine()->Alltoall(name, in, splits);
}
Handle ReducescatterAsync(const std::string& name, const Array& in, ReduceOp op) {
  return TheEngine()->Reducescatter(name, in, op);
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
void Barrier() { TheEngine()->Barrier().Wait(); }

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
