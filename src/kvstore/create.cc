// KVStore::Create: picks the implementation for a type name.
#include <algorithm>
#include <array>
#include <string_view>

#include "common/config/config.h"
#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "dtrain/kvstore/kvstore.h"
#include "kvstore/collective_kvstore.h"
#include "kvstore/device_staging_kvstore.h"
#include "kvstore/dist_kvstore.h"
#include "kvstore/local_kvstore.h"
#include "ps/roles.h"
#include "transport/tcp/tcp_transport.h"

namespace dtrain {
namespace {

// MXNet's names, plus "dist" (the seeds' kv.create('dist')) and "dist_device_sync" (a spelling
// the seeds use) as aliases of dist_sync / dist_sync_device.
// "horovod" is allreduce mode (collective_kvstore.h).
constexpr std::array<std::string_view, 9> kTypes = {
    "local", "device",           "dist_sync", "dist_async", "dist_sync_device", "dist_async_device",
    "dist",  "dist_device_sync", "horovod"};

std::string Canonical(const std::string& type) {
  if (type == "dist") return "dist_sync";
  if (type == "dist_device_sync") return "dist_sync_device";
  return type;
}

std::unique_ptr<KVStore> CreateOnHost(const std::string& requested) {
  const std::string type = Canonical(requested);
  if (type == "local" || type == "device") {
    return std::make_unique<LocalKVStore>(type, Config::FromEnvironment());
  }
  if (type == "horovod") return std::make_unique<CollectiveKVStore>(Config::FromEnvironment());
  if (type.rfind("dist_", 0) == 0 &&
      std::find(kTypes.begin(), kTypes.end(), type) != kTypes.end()) {
    ps::RunRoleFromEnvironmentIfService();  // servers and schedulers never return from here
    const Config config = Config::FromEnvironment();
    config.RequireDistributed("kvstore type '" + requested + "' was created");
    return std::make_unique<DistKVStore>(
        type, config,
        std::make_unique<transport::TcpTransport>(transport::TcpOptions::FromConfig(config)),
        /*exit_on_failure=*/true);
  }
  std::string known;
  for (auto t : kTypes) known += (known.empty() ? "" : ", ") + std::string(t);
  throw InvalidArgument("unknown kvstore type '" + requested + "' (known: " + known + ")");
}

}  // namespace

std::unique_ptr<KVStore> KVStore::Create(const std::string& type) {
  auto store = CreateOnHost(type);
  // Where CUDA is built in, device arrays may come: they are staged around the host store.
  if (!cuda::Built()) return store;
  return std::make_unique<DeviceStagingKVStore>(std::move(store));
}

}  // namespace dtrain
