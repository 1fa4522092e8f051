// The list forms of the KVStore API, shared by every store type. KVStore::Create is in create.cc.
#include "dtrain/kvstore/kvstore.h"

#include <string>
#include <unordered_map>

#include "dtrain/common/error.h"
#include "kvstore/key_names.h"

namespace dtrain {
namespace {

void CheckCounts(const char* call, size_t keys, size_t lists, const char* what) {
  if (keys != lists) {
    throw InvalidArgument(std::string(call) + ": " + std::to_string(keys) + " keys but " +
                          std::to_string(lists) + " " + what + " (one per key)");
  }
}

// The entries of one key in a list call, in the order the keys first appear.
struct KeyGroup {
  Key key;
  std::vector<Array> values;
  std::vector<Array> outs;
};

// As MXNet does (GroupKVPairs), a key listed twice is one push of all its arrays, not two pushes
// one after the other: two pushes would keep only the second sum in a store without optimizer,
// and a dist_sync store would count them as two workers' contributions to the round.
std::vector<KeyGroup> GroupByKey(std::span<const Key> keys,
                                 std::span<const std::vector<Array>> values,
                                 std::span<const std::vector<Array>> outs) {
  std::vector<KeyGroup> groups;
  std::unordered_map<Key, size_t> index;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, added] = index.try_emplace(keys[i], groups.size());
    if (added) groups.push_back({keys[i], {}, {}});
    KeyGroup& g = groups[it->second];
    if (!values.empty()) g.values.insert(g.values.end(), values[i].begin(), values[i].end());
    if (!outs.empty()) g.outs.insert(g.outs.end(), outs[i].begin(), outs[i].end());
  }
  return groups;
}

}  // namespace

Operation KVStore::PushRows(Key key, std::vector<int64_t>, const Array&, int) {
  throw InvalidArgument("push of rows of key " + KeyLabel(key) + ": the " + type() +
                        " store moves dense values (push the dense gradient)");
}

Operation KVStore::PullRows(Key key, std::vector<int64_t>, const Array&, int) {
  throw InvalidArgument("pull of rows of key " + KeyLabel(key) + ": the " + type() +
                        " store moves dense values (pull the dense value)");
}

void KVStore::Init(std::span<const Key> keys, std::span<const Array> values) {
  CheckCounts("Init", keys.size(), values.size(), "values");
  for (size_t i = 0; i < keys.size(); ++i) Init(keys[i], values[i]);
}

Operation KVStore::Push(std::span<const Key> keys, std::span<const std::vector<Array>> values,
                        int priority) {
  CheckCounts("Push", keys.size(), values.size(), "value lists");
  std::vector<Operation> ops;
  for (KeyGroup& g : GroupByKey(keys, values, {})) {
    ops.push_back(Push(g.key, std::move(g.values), priority));
  }
  return Operation::Combine(ops);
}

Operation KVStore::Pull(std::span<const Key> keys, std::span<const std::vector<Array>> outs,
                        int priority) {
  CheckCounts("Pull", keys.size(), outs.size(), "out lists");
  std::vector<Operation> ops;
  for (KeyGroup& g : GroupByKey(keys, {}, outs)) {
    ops.push_back(Pull(g.key, std::move(g.outs), priority));
  }
  return Operation::Combine(ops);
}

Operation KVStore::PushPull(std::span<const Key> keys, std::span<const std::vector<Array>> values,
                            std::span<const std::vector<Array>> outs, int priority) {
  CheckCounts("PushPull", keys.size(), values.size(), "value lists");
  CheckCounts("PushPull", keys.size(), outs.size(), "out lists");
  std::vector<Operation> ops;
  for (KeyGroup& g : GroupByKey(keys, values, outs)) {
    ops.push_back(PushPull(g.key, std::move(g.values), std::move(g.outs), priority));
  }
  return Operation::Combine(ops);
}

}  // namespace dtrain
