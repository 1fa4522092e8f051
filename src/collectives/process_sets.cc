#include "collectives/process_sets.h"

#include <algorithm>
#include <span>
#include <string>

#include "collectives/nccl/hierarchy.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

// Ranks travel as float32 in the agreement (the engine reduces floats): exact below 2^24.
constexpr int kMaxRank = 1 << 24;

// "[0, 2]": ranks, or ids, as the agreement carries them (float) or as asked (int).
template <typename T>
std::string ListText(std::span<const T> values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(static_cast<long long>(values[i]));
  }
  return text + "]";
}

std::string RanksText(const std::vector<int>& ranks) { return ListText<int>(ranks); }

}  // namespace

ProcessSetTable::ProcessSetTable(std::shared_ptr<Engine> world,
                                 std::shared_ptr<Communicator> world_backend,
                                 CollectivesConfig config)
    : world_(std::move(world)), world_backend_(std::move(world_backend)), config_(config) {
  config_.nccl = false;
  // Autotune is the global set's (as Horovod's): one tuner, one log; the sets keep the values
  // configured.
  config_.autotune = false;
}

void ProcessSetTable::Agree(const char* what, const std::vector<float>& request) {
  // Each rank's block: its count of numbers, then the numbers; the blocks arrive in rank order.
  std::vector<float> block{static_cast<float>(request.size())};
  block.insert(block.end(), request.begin(), request.end());
  const std::string name = "dtrain.process_sets." + std::to_string(changes_++);
  Handle h =
      world_->Allgather(name, Array::FromFloats(block, {static_cast<int64_t>(block.size())}));
  h.Wait();
  const Array result = h.result();
  const std::span<const float> gathered = result.floats();
  std::vector<std::string> asked;
  bool same = true;
  for (size_t at = 0; at < gathered.size();) {
    const auto n = static_cast<size_t>(gathered[at]);
    if (at + 1 + n > gathered.size()) throw ProtocolError("a malformed process set agreement");
    same = same && n == request.size() &&
           std::equal(request.begin(), request.end(), gathered.begin() + at + 1);
    asked.push_back(ListText(gathered.subspan(at + 1, n)));
    at += 1 + n;
  }
  if (!same) {
    std::string text;
    for (size_t r = 0; r < asked.size(); ++r) {
      text += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " " + asked[r];
    }
    throw InvalidArgument(std::string(what) +
                          " is a collective of the whole job, and its ranks asked for different "
                          "things: " +
                          text +
                          " (every rank must call it in the same order with the same "
                          "arguments)");
  }
}

int ProcessSetTable::Add(std::vector<int> ranks) {
  std::lock_guard<std::mutex> change(change_mutex_);
  std::sort(ranks.begin(), ranks.end());
  std::vector<float> request;
  // A rank out of float32's exact range travels as -1, which the checks below refuse.
  for (int r : ranks) request.push_back(r >= 0 && r < kMaxRank ? static_cast<float>(r) : -1.0f);
  Agree("add_process_set", request);

  const int size = world_backend_->size();
  if (ranks.empty())
    throw InvalidArgument("add_process_set: a process set needs at least one rank");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      throw InvalidArgument("add_process_set " + RanksText(ranks) + ": " +
                            std::to_string(ranks[i]) + " is not a rank of this job of " +
                            std::to_string(size));
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      throw InvalidArgument("add_process_set " + RanksText(ranks) + ": rank " +
                            std::to_string(ranks[i]) + " is named twice");
    }
  }
  if (static_cast<int>(ranks.size()) == size) {
    throw InvalidArgument("add_process_set " + RanksText(ranks) +
                          ": these are all the job's ranks, which are process set 0 already");
  }
  int id = 1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [existing, set] : sets_) {
      if (set.ranks == ranks) {
        throw InvalidArgument("add_process_set " + RanksText(ranks) + ": process set " +
                              std::to_string(existing) + " has these ranks already");
      }
    }
    while (sets_.count(id)) ++id;
  }
  if (generation_ + 1 >= kCrossHostGenerations) {
    // Every rank counts the same, so every rank refuses alike.
    throw InvalidArgument("add_process_set " + RanksText(ranks) + ": this job has added " +
                          std::to_string(generation_) + " process sets, the most it can");
  }
  const int generation = ++generation_;
  Set set{ranks, nullptr};
  const int me = world_backend_->rank();
  if (std::binary_search(ranks.begin(), ranks.end(), me)) {
    std::shared_ptr<Communicator> backend = world_backend_->Subset(ranks, generation);
    set.engine = std::make_shared<Engine>(std::move(backend), config_);
  }
  DTRAIN_LOG(kConnections) << "collectives: process set " << id << " = ranks " << RanksText(ranks)
                           << (set.engine ? ", this rank among them" : "");
  std::lock_guard<std::mutex> lock(mutex_);
  sets_.emplace(id, std::move(set));
  return id;
}

bool ProcessSetTable::Remove(int id) {
  std::lock_guard<std::mutex> change(change_mutex_);
  Agree("remove_process_set", {id >= 0 && id < kMaxRank ? static_cast<float>(id) : -1.0f});
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sets_.find(id);
    if (it == sets_.end()) return false;
    engine = std::move(it->second.engine);
    sets_.erase(it);
  }
  if (engine) engine->Shutdown();
  return true;
}

std::shared_ptr<Engine> ProcessSetTable::EngineOf(int id) const {
  if (id == 0) return world_;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    throw InvalidArgument("there is no process set " + std::to_string(id) +
                          " (add_process_set makes one; removed sets are gone)");
  }
  if (!it->second.engine) {
    throw InvalidArgument("rank " + std::to_string(world_backend_->rank()) +
                          " is not a member of process set " + std::to_string(id) + " (ranks " +
                          RanksText(it->second.ranks) + ")");
  }
  return it->second.engine;
}

std::vector<int> ProcessSetTable::Ranks(int id) const {
  if (id == 0) {
    std::vector<int> all(world_backend_->size());
    for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
    return all;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) throw InvalidArgument("there is no process set " + std::to_string(id));
  return it->second.ranks;
}

std::vector<int> ProcessSetTable::Ids() const {
  std::vector<int> ids{0};
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& entry : sets_) ids.push_back(entry.first);
  return ids;
}

void ProcessSetTable::ShutdownAll() {
  std::map<int, Set> sets;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sets.swap(sets_);
  }
  for (auto& entry : sets) {
    if (entry.second.engine) entry.second.engine->Shutdown();
  }
}

}  // namespace dtrain::collectives
