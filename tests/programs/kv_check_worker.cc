// A worker that checks the KVStore protocol end to end, for the integration tests.
//
// Every check is in-band: a worker exits non-zero (after printing what differed) when a pulled
// value is not exactly what the protocol promises. Values are small integers, so float sums are
// exact.
//
//   kv_check_worker --scenario sync  --rounds 20   every pull == sum of that round's pushes
//   kv_check_worker --scenario async --rounds 20   final value == total of all pushes
//   kv_check_worker --scenario barrier --dir D     nobody passes a barrier before all arrive
//   kv_check_worker --scenario die --die-rank 1    rank 1 dies mid-job; the others must fail fast
//   kv_check_worker --scenario sync --kill-at-round 5 --die-rank 1
//       rank 1's first process pushes half of round 5's keys and kills itself (SIGKILL); under
//       dtrain launch --max-restarts its replacement resumes at kv.rounds_done() and every
//       worker's pulls must still be exact (no push counted twice or lost)
//   kv_check_worker --scenario sync --kill-at-round 5 --die-rank 0 --kill-server 1
//       rank 0 pushes half of round 5's keys and kills server 1 (SIGKILL; found by its
//       environment, /proc); under dtrain launch --max-restarts with DTRAIN_CHECKPOINT_DIR the
//       server's replacement restores its checkpoint, the workers repeat the rounds since, and
//       every pull must still be exact
//   kv_check_worker --scenario sync --kill-at-round 5 --die-rank 1 --then-kill-server 1
//       rank 1 kills itself half-way through round 5, and server 1 is killed 150 ms later (by a
//       process it leaves behind), while rank 1's replacement starts (it waits 400 ms first):
//       the server checkpoints the lost worker's pushes when it loses it, and every pull must
//       still be exact
//   kv_check_worker --scenario sync --kill-at-round 5 --die-rank 1 --replacement-kills-server 0
//       rank 1 kills itself half-way through round 5; its replacement, once it has rejoined and
//       before its first push, kills server 0 and waits 1.5 s: server 0's replacement restores
//       while the replacement's push log has only the rounds it started at, and every pull must
//       still be exact
//   kv_check_worker --scenario sync --kill-at-round 5 --die-rank 1 --stop-instead
//       rank 1's first process stops itself (SIGSTOP) at round 5 and stays stopped: silent, its
//       connections open. The scheduler loses it by its heartbeats, the launcher kills it, and
//       its replacement resumes (issue 63: a host cut off is lost the same way)
//   kv_check_worker --scenario sync --die-rank 1 --die-before-init
//       rank 1's first process kills itself after the rank check (a user barrier) and before
//       the keys' init, whose barrier the others then wait at: its replacement must join that
//       barrier, and skip the rank check's init (issue 63)
//   kv_check_worker --scenario async --kill-at-round 5 --die-rank 1 [--kill-server 0]
//       as sync's, for dist_async: rank 1 pushes half of round 5's keys and kills itself (or
//       server 0), and the final values must still be the total of every rank's pushes, each
//       counted once (issue 63: a replacement started again from round 0, and a restored server
//       lost every asynchronous push since its checkpoint)
//   kv_check_worker --scenario async --die-rank 1 --die-after-init
//       rank 1's first process kills itself after its keys' inits, before any push: its
//       replacement must skip every init's barrier (dist_async keys have no rounds to say so)
//   kv_check_worker --scenario sync --die-rank 1 --die-after-the-job
//       rank 1's first process finishes the job, then kills itself once the scheduler has
//       ended the job: no replacement could join any more
//   kv_check_worker --scenario sync --kill-at-round 5 --die-rank 0 --kill-server 1 --and-die
//       as --kill-server, but rank 0 kills itself right after the server: its pushes to server 1
//       since the server's last checkpoint are lost with both processes, and those rounds
//       complete without them (docs/reliability.md). A pull that lacks exactly rank 0's push is
//       counted (and printed) instead of failing; any other difference fails
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dtrain/common/error.h"
#include "dtrain/kvstore/init.h"
#include "dtrain/kvstore/kvstore.h"

namespace {

using dtrain::Array;
using dtrain::Key;

struct Options {
  std::string scenario = "sync";
  std::string kvstore;
  int rounds = 10;
  int devices = 1;
  int die_rank = 1;
  int die_after = 3;
  int round_pause_ms = 0;     // a pause before each round, to keep a job running a while
  int kill_at_round = -1;     // sync, async: see the top of the file
  int kill_server = -1;       // sync, async: the server rank die_rank kills instead of itself
  int then_kill_server = -1;  // sync: the server rank killed 150 ms after die_rank dies
  bool and_die = false;       // sync: die_rank dies right after killing kill_server
  bool stop_instead = false;  // sync: die_rank stops itself (SIGSTOP) at kill_at_round instead
  int replacement_kills_server = -1;  // sync: die_rank's replacement kills this server at once
  bool die_before_init = false;       // sync: see the top of the file
  bool die_after_init = false;        // async: see the top of the file
  bool die_after_the_job = false;     // see the top of the file
  std::string dir;
  std::vector<int64_t> sizes = {1, 7, 1000, 70000, 250000, 1200000};
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "CHECK FAILED: %s\n", what.c_str());
  return 2;
}

// The pid of this job's server `rank` (same DMLC_PS_ROOT_PORT as ours), from /proc; -1 if none.
pid_t FindServer(int rank) {
  const char* port = std::getenv("DMLC_PS_ROOT_PORT");
  if (port == nullptr) return -1;
  const std::vector<std::string> wanted = {"DMLC_ROLE=server",
                                           "DTRAIN_NODE_RANK=" + std::to_string(rank),
                                           std::string("DMLC_PS_ROOT_PORT=") + port};
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t found = 0;
    for (const auto& w : wanted) {
      found += env.find(std::string(1, '\0') + w + std::string(1, '\0')) != std::string::npos ||
               env.rfind(w + std::string(1, '\0'), 0) == 0;
    }
    if (found != wanted.size()) continue;
    // The server itself (`dtrain server`), not a process that shares its environment, such as
    // the `cat` of ssh's guard (remote_command.cc), which comes first in /proc once pids wrap.
    std::ifstream cmdline_in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(cmdline_in)),
                        std::istreambuf_iterator<char>());
    const size_t first_end = cmdline.find('\0');
    if (first_end != std::string::npos &&
        cmdline.compare(first_end + 1, std::string::npos, std::string("server") + '\0') == 0) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
}

float PushedValue(int rank, int round, Key key, int64_t i) {
  return static_cast<float>((rank + 1) * (round + 1) + static_cast<int>((i + key) % 7));
}

float ExpectedSum(int workers, int round, Key key, int64_t i) {
  return static_cast<float>((round + 1) * workers * (workers + 1) / 2 +
                            workers * static_cast<int>((i + key) % 7));
}

// The value split over `devices` arrays whose sum is the value (exactly: integers).
std::vector<Array> DeviceValues(const Array& value, int devices) {
  std::vector<Array> out;
  for (int d = 0; d < devices; ++d) out.push_back(Array(value.shape()));
  auto v = value.floats();
  for (int64_t i = 0; i < value.size(); ++i) {
    float rest = v[i];
    for (int d = 0; d + 1 < devices; ++d) {
      out[d].floats()[i] = 1.0f;
      rest -= 1.0f;
    }
    out[devices - 1].floats()[i] = rest;
  }
  return out;
}

// The first process of `rank` (DTRAIN_RESTART_COUNT unset or 0): a replacement never kills itself.
bool FirstLifeOf(const dtrain::KVStore& kv, int rank) {
  const char* restart = std::getenv("DTRAIN_RESTART_COUNT");
  return kv.rank() == rank && (restart == nullptr || std::string(restart) == "0");
}

void KillSelf(const dtrain::KVStore& kv, const char* when) {
  std::printf("rank %d kills itself %s\n", kv.rank(), when);
  std::fflush(stdout);
  ::raise(SIGKILL);
}

int CheckRanks(dtrain::KVStore& kv) {
  // Each worker sets its own slot of a one-hot vector; the sum is all ones iff ranks are distinct.
  const int n = kv.num_workers();
  const Key key = 999;
  kv.Init(key, Array({n}));
  Array mine({n});
  mine.floats()[kv.rank()] = 1.0f;
  Array out({n});
  kv.Push(key, {mine}).Wait();
  kv.Barrier();  // in dist_async a push is applied alone; wait until all are in
  kv.Pull(key, {out}).Wait();
  for (int r = 0; r < n; ++r) {
    if (out.floats()[r] != 1.0f) return Fail("ranks are not distinct: slot " + std::to_string(r));
  }
  return 0;
}

int RunSync(dtrain::KVStore& kv, const Options& o) {
  const int n = kv.num_workers();
  std::vector<Key> keys;
  for (size_t k = 0; k < o.sizes.size(); ++k) keys.push_back(static_cast<Key>(k));
  std::vector<Array> init;
  for (int64_t s : o.sizes) init.push_back(Array({s}));
  if (o.die_before_init && FirstLifeOf(kv, o.die_rank)) KillSelf(kv, "before the keys' init");
  kv.Init(keys, init);
  const int first_round = static_cast<int>(kv.rounds_done());
  int short_pulls = 0;  // --and-die: pulls that lacked exactly the lost push
  if (kv.rejoined()) {
    std::printf("rank %d replaces a lost worker: resuming at round %d\n", kv.rank(), first_round);
    std::fflush(stdout);
    if (o.replacement_kills_server >= 0) {
      // Before this process's first push: the server is restored while the new push log holds
      // no push of this process yet (issue 63's double fault, worker then server).
      const pid_t server = FindServer(o.replacement_kills_server);
      if (server <= 0)
        return Fail("cannot find server " + std::to_string(o.replacement_kills_server));
      ::kill(server, SIGKILL);
      std::printf("rank %d's replacement killed server %d before its first push\n", kv.rank(),
                  o.replacement_kills_server);
      std::fflush(stdout);
      // No push until the server's replacement has restored: the window stays open.
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
  }
  for (int round = first_round; round < o.rounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.round_pause_ms));
    const bool kill_now = FirstLifeOf(kv, o.die_rank) && round == o.kill_at_round;
    size_t pushed_already = 0;  // keys of this round pushed before killing a server
    if (kill_now && o.kill_server >= 0) {
      for (; pushed_already < keys.size() / 2; ++pushed_already) {
        const size_t k = pushed_already;
        Array value({o.sizes[k]});
        auto v = value.floats();
        for (int64_t i = 0; i < o.sizes[k]; ++i) v[i] = PushedValue(kv.rank(), round, keys[k], i);
        kv.Push(keys[k], {value});
      }
      const pid_t server = FindServer(o.kill_server);
      if (server <= 0) return Fail("cannot find server " + std::to_string(o.kill_server));
      ::kill(server, SIGKILL);
      std::printf("rank %d killed server %d half-way through round %d\n", kv.rank(), o.kill_server,
                  round);
      std::fflush(stdout);
      if (o.and_die) ::raise(SIGKILL);
    } else if (kill_now && o.stop_instead) {
      // Silent, not dead: its connections stay open and only its heartbeats stop.
      std::printf("rank %d stops itself (SIGSTOP) at round %d\n", kv.rank(), round);
      std::fflush(stdout);
      ::raise(SIGSTOP);
    } else if (kill_now) {
      // Half of the round pushed, then gone without a word: the round is half-pushed.
      for (size_t k = 0; k < keys.size() / 2; ++k) {
        Array value({o.sizes[k]});
        auto v = value.floats();
        for (int64_t i = 0; i < o.sizes[k]; ++i) v[i] = PushedValue(kv.rank(), round, keys[k], i);
        kv.Push(keys[k], {value}).Wait();
      }
      std::printf("rank %d kills itself half-way through round %d\n", kv.rank(), round);
      std::fflush(stdout);
      if (o.then_kill_server >= 0) {
        const pid_t server = FindServer(o.then_kill_server);
        if (server <= 0) return Fail("cannot find server " + std::to_string(o.then_kill_server));
        if (::fork() == 0) {  // outlives us, out of our process group
          ::setsid();
          ::close_range(0, ~0U, 0);  // our connections and pipes must close when we die
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          ::kill(server, SIGKILL);
          ::_exit(0);
        }
      }
      ::raise(SIGKILL);
    }
    std::vector<Array> outs;
    std::vector<dtrain::Operation> ops;
    for (size_t k = 0; k < keys.size(); ++k) {
      Array value({o.sizes[k]});
      auto v = value.floats();
      for (int64_t i = 0; i < o.sizes[k]; ++i) v[i] = PushedValue(kv.rank(), round, keys[k], i);
      outs.push_back(Array({o.sizes[k]}));
      auto devices = DeviceValues(value, o.devices);
      if (k < pushed_already) {
        ops.push_back(kv.Pull(keys[k], {outs.back()}));
      } else if (round % 2 == 0) {
        ops.push_back(kv.PushPull(keys[k], devices, {outs.back()}));
      } else {
        kv.Push(keys[k], devices);
        ops.push_back(kv.Pull(keys[k], {outs.back()}));
      }
    }
    for (auto& op : ops) op.Wait();
    for (size_t k = 0; k < keys.size(); ++k) {
      auto got = outs[k].floats();
      const bool lacks_lost_push =
          o.and_die && o.sizes[k] > 0 &&
          got[0] == ExpectedSum(n, round, keys[k], 0) - PushedValue(o.die_rank, round, keys[k], 0);
      if (lacks_lost_push) {
        std::printf("round %d key %lld lacks rank %d's lost push\n", round,
                    static_cast<long long>(keys[k]), o.die_rank);
        ++short_pulls;
      }
      for (int64_t i = 0; i < o.sizes[k]; ++i) {
        float want = ExpectedSum(n, round, keys[k], i);
        if (lacks_lost_push) want -= PushedValue(o.die_rank, round, keys[k], i);
        if (got[i] != want) {
          return Fail("round " + std::to_string(round) + " key " + std::to_string(keys[k]) +
                      " element " + std::to_string(i) + ": got " + std::to_string(got[i]) +
                      ", want " + std::to_string(want));
        }
      }
    }
  }
  std::printf("sync OK: rank %d of %d, %d rounds, %zu keys, %d pull(s) lacking a lost push\n",
              kv.rank(), n, o.rounds, keys.size(), short_pulls);
  return 0;
}

int RunAsync(dtrain::KVStore& kv, const Options& o) {
  const int n = kv.num_workers();
  for (size_t k = 0; k < o.sizes.size(); ++k) kv.Init(static_cast<Key>(k), Array({o.sizes[k]}));
  if (o.die_after_init && FirstLifeOf(kv, o.die_rank)) KillSelf(kv, "after the keys' inits");
  const int first_round = static_cast<int>(kv.rounds_done());
  if (kv.rejoined()) {
    std::printf("rank %d replaces a lost worker: resuming at round %d\n", kv.rank(), first_round);
    std::fflush(stdout);
  }
  auto push = [&](size_t k) {
    Array value({o.sizes[k]});
    value.Fill(static_cast<float>(kv.rank() + 1));
    return kv.Push(static_cast<Key>(k), DeviceValues(value, o.devices));
  };
  for (int round = first_round; round < o.rounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.round_pause_ms));
    if (FirstLifeOf(kv, o.die_rank) && round == o.kill_at_round) {
      // Half of the round's keys pushed (and applied), then gone without a word.
      for (size_t k = 0; k < o.sizes.size() / 2; ++k) push(k);
      kv.WaitAll();
      if (o.kill_server >= 0) {
        // This rank's pushes since the server's last checkpoint are in its push log only.
        const pid_t server = FindServer(o.kill_server);
        if (server <= 0) return Fail("cannot find server " + std::to_string(o.kill_server));
        ::kill(server, SIGKILL);
        std::printf("rank %d killed server %d half-way through round %d\n", kv.rank(),
                    o.kill_server, round);
        std::fflush(stdout);
      } else {
        std::printf("rank %d kills itself half-way through round %d\n", kv.rank(), round);
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      for (size_t k = o.sizes.size() / 2; k < o.sizes.size(); ++k) push(k);
      continue;
    }
    for (size_t k = 0; k < o.sizes.size(); ++k) push(k);
  }
  kv.WaitAll();
  kv.Barrier();
  const float want = static_cast<float>(o.rounds * n * (n + 1) / 2);
  for (size_t k = 0; k < o.sizes.size(); ++k) {
    Array out({o.sizes[k]});
    kv.Pull(static_cast<Key>(k), {out}).Wait();
    for (float x : out.floats()) {
      if (x != want)
        return Fail("async key " + std::to_string(k) + ": got " + std::to_string(x) + ", want " +
                    std::to_string(want));
    }
  }
  std::printf("async OK: rank %d of %d\n", kv.rank(), n);
  return 0;
}

int RunBarrier(dtrain::KVStore& kv, const Options& o) {
  namespace fs = std::filesystem;
  const int n = kv.num_workers();
  for (int round = 0; round < o.rounds; ++round) {
    // The last rank arrives late; everyone must still see its mark after the barrier.
    if (kv.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(fs::path(o.dir) /
                  ("arrived-" + std::to_string(round) + "-" + std::to_string(kv.rank())));
    kv.Barrier();
    for (int r = 0; r < n; ++r) {
      if (!fs::exists(fs::path(o.dir) /
                      ("arrived-" + std::to_string(round) + "-" + std::to_string(r)))) {
        return Fail("passed barrier " + std::to_string(round) + " before rank " +
                    std::to_string(r) + " arrived");
      }
    }
  }
  std::printf("barrier OK: rank %d\n", kv.rank());
  return 0;
}

// Misuse must throw InvalidArgument at the call, with a message that says what is wrong.
template <typename F>
int ExpectInvalid(const std::string& what, const std::string& needle, F&& f) {
  try {
    f();
  } catch (const dtrain::InvalidArgument& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      return Fail(what + ": message '" + e.what() + "' lacks '" + needle + "'");
    }
    std::printf("%s -> %s\n", what.c_str(), e.what());
    return 0;
  }
  return Fail(what + ": no error");
}

int RunErrors(dtrain::KVStore& kv) {
  int rc = 0;
  rc |= ExpectInvalid("pull of a key never initialised", "never initialised",
                      [&] { kv.Pull(12345, {Array({3})}).Wait(); });
  kv.Init(1, Array({4}));
  rc |=
      ExpectInvalid("init of a key twice", "already initialised", [&] { kv.Init(1, Array({4})); });
  rc |= ExpectInvalid("push of the wrong length", "(4,)", [&] { kv.Push(1, {Array({5})}).Wait(); });
  rc |=
      ExpectInvalid("pull into the wrong length", "(4,)", [&] { kv.Pull(1, {Array({3})}).Wait(); });
  rc |= ExpectInvalid("push of no values", "no value", [&] { kv.Push(1, {}).Wait(); });
  rc |= ExpectInvalid("unknown optimizer", "nosuchopt", [&] {
    kv.SetOptimizer({"nosuchopt", {}});
  });
  // The store still works after all that.
  Array out({4});
  kv.PushPull(1, {Array::FromFloats(std::vector<float>{1, 2, 3, 4})}, {out}).Wait();
  if (out.floats()[3] != 4.0f) return Fail("store broken after errors");
  if (rc == 0) std::printf("errors OK\n");
  return rc;
}

int RunDie(dtrain::KVStore& kv, const Options& o) {
  kv.Init(0, Array({1000}));
  Array grad({1000});
  Array out({1000});
  for (int round = 0;; ++round) {
    if (kv.rank() == o.die_rank && round == o.die_after) {
      std::printf("rank %d dying now (pid %d)\n", kv.rank(), static_cast<int>(getpid()));
      std::fflush(stdout);
      std::_Exit(9);
    }
    kv.PushPull(0, {grad}, {out}).Wait();  // throws once the job has failed
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::Initialize();
  CLI::App app{"KVStore protocol checker"};
  Options o;
  app.add_option("--scenario", o.scenario)
      ->check(CLI::IsMember({"sync", "async", "barrier", "die", "errors"}));
  app.add_option("--kvstore", o.kvstore);
  app.add_option("--rounds", o.rounds);
  app.add_option("--devices", o.devices)->check(CLI::Range(1, 8));
  app.add_option("--sizes", o.sizes)->delimiter(',');
  app.add_option("--die-rank", o.die_rank);
  app.add_option("--die-after", o.die_after);
  app.add_option("--kill-at-round", o.kill_at_round);
  app.add_option("--kill-server", o.kill_server);
  app.add_option("--then-kill-server", o.then_kill_server);
  app.add_flag("--and-die", o.and_die);
  app.add_flag("--stop-instead", o.stop_instead);
  app.add_option("--replacement-kills-server", o.replacement_kills_server);
  app.add_flag("--die-before-init", o.die_before_init);
  app.add_flag("--die-after-init", o.die_after_init);
  app.add_flag("--die-after-the-job", o.die_after_the_job);
  app.add_option("--dir", o.dir);
  app.add_option("--round-pause-ms", o.round_pause_ms);
  CLI11_PARSE(app, argc, argv);
  if (o.kvstore.empty()) o.kvstore = o.scenario == "async" ? "dist_async" : "dist_sync";
  const char* restart = std::getenv("DTRAIN_RESTART_COUNT");
  if (o.then_kill_server >= 0 && restart != nullptr && std::string(restart) != "0") {
    // A replacement as slow to start as a training program: the server is lost meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  try {
    auto kv = dtrain::KVStore::Create(o.kvstore);
    if (kv->num_workers() < 1) return Fail("no workers");
    // A replacement skips the setup's pushes (they would open rounds nobody joins), but makes the
    // same keys in the same order: that order places them on the servers.
    if (!kv->rejoined()) {
      if (int rc = CheckRanks(*kv)) return rc;
    } else {
      kv->Init(999, Array({kv->num_workers()}));
    }
    if (o.scenario == "sync" && o.die_after_the_job) {
      const int rc = RunSync(*kv, o);
      const bool dies = FirstLifeOf(*kv, o.die_rank);
      kv.reset();  // the job ends: the scheduler exits once every worker has finished
      if (rc == 0 && dies) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        std::printf("rank %d kills itself after the job\n", o.die_rank);
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      return rc;
    }
    if (o.scenario == "sync") return RunSync(*kv, o);
    if (o.scenario == "async") return RunAsync(*kv, o);
    if (o.scenario == "barrier") return RunBarrier(*kv, o);
    if (o.scenario == "errors") return RunErrors(*kv);
    return RunDie(*kv, o);
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "kv_check_worker: error: %s\n", e.what());
    return 3;
  }
}
