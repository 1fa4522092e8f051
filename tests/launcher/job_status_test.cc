// JobStatus (launcher/status/job_status.h): what the launcher makes of the processes' records —
// the status page's JSON, the straggler, the structured failure, the end-of-job summary — and that
// a record that does not fit is dropped, never thrown on.
#include "launcher/status/job_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace dtrain::launcher {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

const NodeKey kScheduler{Role::kScheduler, 0};
const NodeKey kServer0{Role::kServer, 0};
const NodeKey kWorker0{Role::kWorker, 0};
const NodeKey kWorker1{Role::kWorker, 1};

constexpr int64_t kStart = 1'000'000'000;
constexpr int64_t kSecond = 1'000'000;

nlohmann::json Progress(double samples_per_s, int64_t samples) {
  return {{"kind", "progress"}, {"steps", samples / 32},
          {"samples", samples}, {"samples_per_s", samples_per_s},
          {"steps_per_s", 3.5}, {"wait_s", 1.0},
          {"active_s", 4.0},    {"timed_samples", samples}};
}

nlohmann::json FailureOf(const std::string& role, int rank, const std::string& cause) {
  return {{"kind", "failure"},
          {"node", {{"role", role}, {"rank", rank}, {"host", "10.0.0.2:9000"}}},
          {"cause", cause}};
}

const nlohmann::json* NodeNamed(const nlohmann::json& status, const std::string& name) {
  for (const nlohmann::json& n : status["nodes"]) {
    if (n["name"] == name) return &n;
  }
  return nullptr;
}

TEST(JobStatus, EveryNodeWithItsStateRatesAndTraffic) {
  JobStatus status(kStart);
  status.ProcessStarted(kScheduler, "127.0.0.1", 40, kStart);
  status.ProcessStarted(kServer0, "127.0.0.1", 41, kStart);
  status.ProcessStarted(kWorker0, "127.0.0.1", 42, kStart);
  status.Apply(kServer0, {{"kind", "traffic"}, {"bytes_in", 1000}, {"bytes_out", 2000}},
               kStart + kSecond);
  status.Apply(kWorker0, Progress(500, 2000), kStart + 2 * kSecond);

  const nlohmann::json j = status.ToJson(kStart + 3 * kSecond);
  EXPECT_DOUBLE_EQ(j["elapsed_s"].get<double>(), 3.0);
  ASSERT_EQ(j["nodes"].size(), 3u);
  const nlohmann::json* scheduler = NodeNamed(j, "scheduler");
  ASSERT_NE(scheduler, nullptr);
  EXPECT_EQ((*scheduler)["state"], "starting");  // launched, not heard of
  EXPECT_TRUE((*scheduler)["last_heard_s_ago"].is_null());
  const nlohmann::json* server = NodeNamed(j, "server 0");
  ASSERT_NE(server, nullptr);
  EXPECT_EQ((*server)["state"], "running");
  EXPECT_EQ((*server)["bytes_in"], 1000);
  EXPECT_EQ((*server)["bytes_out"], 2000);
  const nlohmann::json* worker = NodeNamed(j, "worker 0");
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ((*worker)["pid"], 42);
  EXPECT_EQ((*worker)["samples"], 2000);
  EXPECT_DOUBLE_EQ((*worker)["last_heard_s_ago"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["samples_per_s"].get<double>(), 500.0);

  status.ProcessExited(kWorker0, true, "exited with code 0", kStart + 4 * kSecond);
  const nlohmann::json after = status.ToJson(kStart + 4 * kSecond);
  EXPECT_EQ((*NodeNamed(after, "worker 0"))["state"], "finished");
}

TEST(JobStatus, AServersCheckpointsAreCountedWithTheLastOnesSize) {
  JobStatus status(kStart);
  status.ProcessStarted(kServer0, "127.0.0.1", 41, kStart);
  for (int i = 1; i <= 3; ++i) {
    status.Apply(kServer0,
                 {{"kind", "checkpoint"}, {"bytes", 1000 * i}, {"ms", 2.5}, {"cpu_ms", 0.5 * i}},
                 kStart + i * kSecond);
  }
  // A CPU time that cannot be one is not added.
  status.Apply(kServer0, {{"kind", "checkpoint"}, {"bytes", 3000}, {"ms", 1.0}, {"cpu_ms", -5}},
               kStart + 4 * kSecond);
  const nlohmann::json j = status.ToJson(kStart + 4 * kSecond);
  const nlohmann::json* server = NodeNamed(j, "server 0");
  ASSERT_NE(server, nullptr);
  EXPECT_EQ((*server)["checkpoints"], 4);
  EXPECT_EQ((*server)["checkpoint_bytes"], 3000);
  EXPECT_DOUBLE_EQ((*server)["checkpoint_ms"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ((*server)["checkpoint_cpu_ms"].get<double>(), 3.0);
  EXPECT_THAT(status.Summary(kStart + 4 * kSecond),
              Contains(HasSubstr("4 checkpoint(s), the last 3000 bytes in 1.0 ms, 3.0 ms of CPU")));
}

TEST(JobStatus, AWorkersPushLogIsSummarised) {
  JobStatus status(kStart);
  status.ProcessStarted(kWorker0, "127.0.0.1", 41, kStart);
  status.Apply(kWorker0,
               {{"kind", "push_log"},
                {"bytes", 123456},
                {"copy_ms", 7.25},
                {"reserved_bytes", 4096},
                {"reserve_ms", 1.5}},
               kStart + kSecond);
  EXPECT_THAT(status.Summary(kStart + 2 * kSecond),
              Contains(HasSubstr("push log: 123456 bytes copied into it in 7.2 ms; 4096 bytes "
                                 "faulted in at the start in 1.5 ms")));
  const nlohmann::json j = status.ToJson(kStart + 2 * kSecond);
  const nlohmann::json* worker = NodeNamed(j, "worker 0");
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ((*worker)["push_log_bytes"], 123456);
  EXPECT_DOUBLE_EQ((*worker)["push_log_copy_ms"].get<double>(), 7.25);
  EXPECT_EQ((*worker)["push_log_reserved_bytes"], 4096);
}

TEST(JobStatus, AReplacedWorkersRestartSaysWhenItRejoinedAndWhichRoundsWereLost) {
  JobStatus status(kStart);
  status.ProcessStarted(kWorker1, "127.0.0.1", 41, kStart);
  status.ProcessRestarted(kWorker1, "was killed by signal 9 (SIGKILL)", 42, kStart + 2 * kSecond);
  const nlohmann::json rejoined = {
      {"kind", "member_rejoined"}, {"node", {{"role", "worker"}, {"rank", 1}}}, {"seconds", 0.7}};
  status.Apply(kScheduler, rejoined, kStart + 3 * kSecond);
  // Malformed: no such worker, no rounds, rounds backwards. Dropped, and no node added.
  for (const nlohmann::json& bad :
       {nlohmann::json{{"kind", "rounds_lost"}, {"worker", 7}, {"first", 2}, {"last", 3}},
        nlohmann::json{{"kind", "rounds_lost"}, {"worker", 1}},
        nlohmann::json{{"kind", "rounds_lost"}, {"worker", 1}, {"first", 5}, {"last", 4}}}) {
    status.Apply(kServer0, bad, kStart + 3 * kSecond);
  }
  status.Apply(kServer0, {{"kind", "rounds_lost"}, {"worker", 1}, {"first", 4}, {"last", 6}},
               kStart + 3 * kSecond);
  const nlohmann::json j = status.ToJson(kStart + 4 * kSecond);
  EXPECT_EQ(NodeNamed(j, "worker 7"), nullptr);
  EXPECT_EQ(j["dropped_records"], 3);
  const nlohmann::json* worker = NodeNamed(j, "worker 1");
  ASSERT_NE(worker, nullptr);
  ASSERT_EQ((*worker)["restarts"].size(), 1u);
  EXPECT_EQ((*worker)["restarts"][0],
            "at 2.0 s: was killed by signal 9 (SIGKILL); rejoined 0.70 s after the loss; rounds "
            "lost: 4-6 completed without its pushes to server 0 (lost with that server's process "
            "too)");
}

TEST(JobStatus, AnElasticJobsMembershipChangesAreListedInOrderWithTheirTime) {
  JobStatus status(kStart);
  status.JobReset("worker 1 (pid 7) killed by signal 9: slot retired", kStart + 2 * kSecond);
  status.JobReset("membership 2: 2 rank(s): worker 0, worker 2", kStart + 3 * kSecond);
  const nlohmann::json j = status.ToJson(kStart + 4 * kSecond);
  ASSERT_EQ(j["resets"].size(), 2u);
  EXPECT_EQ(j["resets"][0], "at 2.0 s: worker 1 (pid 7) killed by signal 9: slot retired");
  EXPECT_THAT(status.Summary(kStart + 4 * kSecond),
              Contains("  elastic at 3.0 s: membership 2: 2 rank(s): worker 0, worker 2"));
}

TEST(JobStatus, TheSlowestWorkerIsAStragglerOnlyWhenMoreThanTenPercentBehind) {
  JobStatus status(kStart);
  status.Apply(kWorker0, Progress(1000, 100), kStart);
  EXPECT_FALSE(status.Straggler());  // one worker: nobody to be slow against
  status.Apply(kWorker1, Progress(950, 100), kStart);
  EXPECT_FALSE(status.Straggler());
  status.Apply(kWorker1, Progress(800, 200), kStart);
  ASSERT_TRUE(status.Straggler());
  EXPECT_EQ(*status.Straggler(), kWorker1);
  const nlohmann::json j = status.ToJson(kStart);
  EXPECT_EQ(j["straggler"], "worker 1");
  EXPECT_EQ((*NodeNamed(j, "worker 1"))["straggler"], true);
  EXPECT_EQ((*NodeNamed(j, "worker 0"))["straggler"], false);
}

TEST(JobStatus, TheFirstFailureRecordIsTheCauseAndNamesItsWitness) {
  JobStatus status(kStart);
  std::optional<FailureRecord> f =
      status.Apply(kScheduler, FailureOf("worker", 1, "its connection closed"), kStart);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->node, kWorker1);
  EXPECT_EQ(f->host, "10.0.0.2:9000");
  EXPECT_EQ(f->Text(), "worker 1 failed: its connection closed (reported by the scheduler)");
  // What fails after it does not replace it; a rank reporting a peer is named as itself.
  std::optional<FailureRecord> later =
      status.Apply(kWorker0, FailureOf("server", 0, "timed out"), kStart);
  ASSERT_TRUE(later);
  EXPECT_EQ(later->Text(), "server 0 failed: timed out (reported by worker 0)");
  EXPECT_EQ(status.first_failure()->node, kWorker1);

  const nlohmann::json j = status.ToJson(kStart);
  EXPECT_EQ(j["failure"]["node"], "worker 1");
  EXPECT_EQ(j["failure"]["reported_by"], "scheduler");
  EXPECT_EQ((*NodeNamed(j, "worker 1"))["state"], "failed");
  EXPECT_THAT(j["errors"].get<std::vector<std::string>>(),
              Contains("worker 1 failed: its connection closed (reported by the scheduler)"));
  EXPECT_THAT(status.Summary(kStart),
              Contains("  the job's cause: worker 1 failed: its connection closed (reported by "
                       "the scheduler)"));
}

TEST(JobStatus, SummaryRatesAreTimedSamplesOverActiveTime) {
  JobStatus status(kStart);
  status.ProcessStarted(kWorker0, "h0", 1, kStart);
  status.ProcessStarted(kWorker1, "h1", 2, kStart);
  status.Apply(kWorker0,
               {{"kind", "summary"},
                {"steps", 100},
                {"samples", 3200},
                {"timed_samples", 3000},
                {"active_s", 2.0},
                {"wait_s", 0.5}},
               kStart);
  status.Apply(kWorker1,
               {{"kind", "summary"},
                {"steps", 100},
                {"samples", 3200},
                {"timed_samples", 3000},
                {"active_s", 3.0},
                {"wait_s", 1.5}},
               kStart);
  status.ProcessExited(kWorker0, true, "exited with code 0", kStart + 5 * kSecond);
  const std::vector<std::string> lines = status.Summary(kStart + 5 * kSecond);
  EXPECT_EQ(lines.front(), "summary: wall time 5.0 s");
  EXPECT_THAT(lines, Contains("  worker 0: 3200 samples in 100 steps, 1500.0 samples/s; step "
                              "time: 75% compute, 25% waiting for communication"));
  EXPECT_THAT(lines, Contains("  worker 1: 3200 samples in 100 steps, 1000.0 samples/s; step "
                              "time: 50% compute, 50% waiting for communication"));
  EXPECT_THAT(lines, Contains("  all workers: 6400 samples, 2500.0 samples/s"));
  EXPECT_THAT(lines, Contains("  worker 0 on h0: exited with code 0"));
  EXPECT_THAT(lines, Contains("  worker 1 on h1: running"));
}

TEST(JobStatus, RecordsThatDoNotFitAreDroppedAndCounted) {
  JobStatus status(kStart);
  const std::vector<nlohmann::json> bad = {
      nlohmann::json::array({1, 2}),
      "progress",
      {{"no_kind", 1}},
      {{"kind", 7}},
      {{"kind", "error"}},                                                 // no message
      {{"kind", "error"}, {"message", 3}},                                 // not text
      {{"kind", "failure"}, {"cause", "x"}},                               // no node
      FailureOf("wizard", 1, "x"),                                         // no such role
      FailureOf("worker", -1, "x"),                                        // no such rank
      {{"kind", "failure"}, {"node", {{"role", "worker"}, {"rank", 1}}}},  // no cause
  };
  for (const nlohmann::json& record : bad) {
    EXPECT_FALSE(status.Apply(kWorker0, record, kStart)) << record.dump();
  }
  EXPECT_EQ(status.dropped(), bad.size());
  EXPECT_FALSE(status.first_failure());
  // Fields of the wrong type are ignored, not converted.
  status.Apply(kWorker0,
               {{"kind", "progress"}, {"samples", 1e300}, {"steps", "many"}, {"wait_s", nullptr}},
               kStart);
  const nlohmann::json j = status.ToJson(kStart);
  const nlohmann::json* w = NodeNamed(j, "worker 0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ((*w)["samples"], 0);
  EXPECT_EQ((*w)["steps"], 0);
  EXPECT_EQ(j["dropped_records"], bad.size());
}

TEST(JobStatus, OverlongTextIsClipped) {
  JobStatus status(kStart);
  status.Apply(kWorker0, {{"kind", "error"}, {"message", std::string(100000, 'x')}}, kStart);
  const nlohmann::json j = status.ToJson(kStart);
  const nlohmann::json* w = NodeNamed(j, "worker 0");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ((*w)["errors"].size(), 1u);
  EXPECT_LT((*w)["errors"][0].get<std::string>().size(), 2100u);
}

// Replaces a random value somewhere in `j` with a value of a random type.
void Mutate(nlohmann::json& j, std::mt19937& rng) {
  std::vector<nlohmann::json*> places{&j};
  for (size_t i = 0; i < places.size(); ++i) {
    if (places[i]->is_structured()) {
      for (auto& child : *places[i]) places.push_back(&child);
    }
  }
  nlohmann::json& target = *places[rng() % places.size()];
  switch (rng() % 9) {
    case 0:
      target = nullptr;
      break;
    case 1:
      target = static_cast<int64_t>(rng()) - (int64_t{1} << 31);
      break;
    case 2:
      target = std::numeric_limits<uint64_t>::max();
      break;
    case 3:
      target = -1e308;
      break;
    case 4:
      target = std::string(rng() % 4000, 'y');
      break;
    case 5:
      target = nlohmann::json::array({1, "a"});
      break;
    case 6:
      target = nlohmann::json::object({{"role", "worker"}, {"rank", rng() % 4}});
      break;
    case 7:
      target = true;
      break;
    default:
      target = "worker";
      break;
  }
}

TEST(JobStatus, RandomMutationsOfRecordsNeverThrow) {
  std::mt19937 rng(20261123);
  const std::vector<nlohmann::json> seeds = {
      Progress(100, 100),
      FailureOf("worker", 1, "lost"),
      {{"kind", "traffic"}, {"bytes_in", 1}, {"bytes_out", 2}},
      {{"kind", "error"}, {"message", "boom"}},
      {{"kind", "summary"}, {"samples", 5}, {"active_s", 1.0}},
  };
  JobStatus status(kStart);
  const NodeKey senders[] = {kScheduler, kServer0, kWorker0, kWorker1};
  for (int i = 0; i < 20000; ++i) {
    nlohmann::json record = seeds[rng() % seeds.size()];
    for (int m = 1 + rng() % 3; m > 0; --m) Mutate(record, rng);
    ASSERT_NO_THROW(status.Apply(senders[rng() % 4], record, kStart + i)) << record.dump();
  }
  ASSERT_NO_THROW(status.ToJson(kStart + kSecond).dump());
  ASSERT_NO_THROW(status.Summary(kStart + kSecond));
  EXPECT_GT(status.dropped(), 0u);
}

}  // namespace
}  // namespace dtrain::launcher
