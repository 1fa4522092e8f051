// String keys, as MXNet's kvstore accepts them (kv.init('fc1.weight', w)).
//
// A name is turned into a Key by hashing it (64-bit FNV-1a) into the range reserved for names,
// [kFirstNamedKey, kFirstNamedKey * 2): every process computes the same key for a name without
// talking to the others, whatever order it meets its names in. Integer keys stay below
// kFirstNamedKey. The names seen by this process are remembered so that errors can say
// "key 'fc1.weight'" rather than a number; two names that hash to one key are an InvalidArgument
// (with 2^43 keys and a few thousand names per job this does not happen in practice, but it is
// never silent).
//
// Threads: any thread.
#pragma once

#include <string>
#include <string_view>

#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

// Integer keys must be in [0, kFirstNamedKey). The servers index optimizer state by
// key * 2^20 + part, so every key, named ones included, stays below 2^44.
constexpr Key kFirstNamedKey = Key{1} << 43;

// The key of `name` (1 to 1024 bytes). Throws InvalidArgument for an empty or overlong name, or
// one whose key another name already took in this process.
Key KeyOfName(std::string_view name);

// How messages refer to `key`: "'fc1.weight'" for a name seen by KeyOfName, the number otherwise.
std::string KeyLabel(Key key);

// Throws InvalidArgument unless `key` is a valid integer key or the key of a known name.
void CheckKey(Key key);

}  // namespace dtrain
