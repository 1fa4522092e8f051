#include "kvstore/key_names.h"

#include <mutex>
#include <unordered_map>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

constexpr size_t kMaxNameLength = 1024;

std::mutex g_mutex;
std::unordered_map<Key, std::string>& Names() {
  static auto* names = new std::unordered_map<Key, std::string>();  // lives until exit
  return *names;
}

uint64_t Fnv1a(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

Key KeyOfName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    throw InvalidArgument("a kvstore key name must have 1 to " + std::to_string(kMaxNameLength) +
                          " characters, got " + std::to_string(name.size()));
  }
  const Key key =
      kFirstNamedKey + static_cast<Key>(Fnv1a(name) % static_cast<uint64_t>(kFirstNamedKey));
  std::lock_guard<std::mutex> lock(g_mutex);
  auto [it, added] = Names().try_emplace(key, name);
  if (!added && it->second != name) {
    throw InvalidArgument("kvstore key names '" + it->second + "' and '" + std::string(name) +
                          "' hash to the same key; rename one of them");
  }
  return key;
}

std::string KeyLabel(Key key) {
  if (key >= kFirstNamedKey) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = Names().find(key);
    if (it != Names().end()) return "'" + it->second + "'";
  }
  return std::to_string(key);
}

void CheckKey(Key key) {
  if (key >= 0 && key < kFirstNamedKey) return;
  if (key >= kFirstNamedKey) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Names().count(key) != 0) return;
  }
  throw InvalidArgument("key " + std::to_string(key) +
                        " is out of range: integer keys must be in [0, 2^43) (larger keys are "
                        "reserved for string keys)");
}

}  // namespace dtrain
