// Autotune's search (collectives/engine/autotune.h) against a made-up job whose step time depends
// on the fusion threshold and cycle time, on a clock the test moves; and its values on the wire.
#include "collectives/engine/autotune.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "collectives/engine/negotiation.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
using std::chrono::microseconds;

TEST(Autotune, CandidatesStartWithTheConfiguredValuesAndHoldEachOnce) {
  EXPECT_EQ(Autotuner::Thresholds(64 * kMiB),
            (std::vector<size_t>{64 * kMiB, 1 * kMiB, 4 * kMiB, 16 * kMiB, 128 * kMiB}));
  EXPECT_EQ(Autotuner::Thresholds(3 * kMiB).size(), 6u);
  EXPECT_EQ(Autotuner::CycleTimes(microseconds(1000)),
            (std::vector<microseconds>{microseconds(1000), microseconds(250), microseconds(500),
                                       microseconds(2500), microseconds(5000)}));
}

// A step reduces 10 gradients of 1 MiB; its time is best at 16 MiB and 0.5 ms, and the job runs
// whatever values the tuner last announced.
struct MadeUpJob {
  TunedParameters in_effect{64 * kMiB, microseconds(1000)};
  Clock::time_point now{};
  int steps = 0;

  static double StepMs(const TunedParameters& p) {
    const double mb = static_cast<double>(p.fusion_threshold_bytes) / kMiB;
    const double cycle_ms = p.cycle_time.count() / 1000.0;
    return 10 + (mb - 16) * (mb - 16) / 64 + 4 * (cycle_ms - 0.5) * (cycle_ms - 0.5);
  }

  void Step(Autotuner& tuner) {
    const auto share = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(StepMs(in_effect) / 10));
    for (int g = 0; g < 10; ++g) {
      tuner.Record("grad." + std::to_string(g), kMiB, now);
      now += share;
      if (auto p = tuner.EndRound()) in_effect = *p;  // every rank's next round
    }
    ++steps;
  }
};

TEST(Autotune, FindsTheBestValuesWithinABoundedNumberOfStepsAndLogsEachSample) {
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("autotune_test_" + std::to_string(::getpid()) + ".csv"))
                              .string();
  MadeUpJob job;
  Autotuner tuner(job.in_effect, AutotuneOptions{3, 10, log});
  while (!tuner.done() && job.steps < 1000) job.Step(tuner);
  ASSERT_TRUE(tuner.done());
  // 3 warmup samples, 5 thresholds, 4 more cycle times, and 2 more samples of each of the 4
  // confirmed (the configured values, 16 MiB at 1 ms, then at 0.5 and 0.25 ms): 20 samples of 10
  // steps and a settling step after each.
  EXPECT_LE(job.steps, 20 * 11 + 2);
  EXPECT_EQ(tuner.best(), (TunedParameters{16 * kMiB, microseconds(500)}));
  EXPECT_EQ(job.in_effect, tuner.best()) << "the job ends at the values found";

  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 20u + 1u);
  EXPECT_EQ(lines[0], "phase,fusion_threshold_bytes,cycle_time_ms,bytes_per_second,best");
  EXPECT_EQ(lines[1].rfind("warmup,67108864,1.000,", 0), 0u) << lines[1];
  const std::vector<std::string> confirmed = {"67108864,1.000,", "16777216,1.000,",
                                              "16777216,0.500,", "16777216,0.250,"};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(lines[13 + i].rfind("confirm," + confirmed[i % 4], 0), 0u) << lines[13 + i];
  }
  EXPECT_EQ(lines.back().rfind("best,16777216,0.500,", 0), 0u) << lines.back();
  std::filesystem::remove(log);
}

TEST(Autotune, WithoutWarmupTheFirstSampleIsTheConfiguredValues) {
  MadeUpJob job;
  job.in_effect = {16 * kMiB, microseconds(500)};  // already the best
  Autotuner tuner(job.in_effect, AutotuneOptions{0, 2, ""});
  while (!tuner.done() && job.steps < 1000) job.Step(tuner);
  EXPECT_TRUE(tuner.done());
  EXPECT_EQ(tuner.best(), (TunedParameters{16 * kMiB, microseconds(500)}));
  EXPECT_LE(job.steps, 17 * 3 + 2);
}

TEST(Autotune, ALuckySampleDoesNotWinTheConfirmationDoes) {
  // The first sample at 2.5 ms is a lucky one (the host was quiet): faster than the true best.
  // Measured again it is slow, and the best median is the true best's.
  struct LuckyJob : MadeUpJob {
    int lucky_steps_left = 11;  // the settling step and the sample's 10
    void Step(Autotuner& tuner) {
      const TunedParameters lucky{16 * kMiB, microseconds(2500)};
      if (in_effect == lucky && lucky_steps_left > 0) {
        --lucky_steps_left;
        for (int g = 0; g < 10; ++g) {
          tuner.Record("grad." + std::to_string(g), kMiB, now);
          now += std::chrono::microseconds(800);  // an 8 ms step: better than the best's 10
          if (auto p = tuner.EndRound()) in_effect = *p;
        }
        ++steps;
        return;
      }
      MadeUpJob::Step(tuner);
    }
  };
  LuckyJob job;
  Autotuner tuner(job.in_effect, AutotuneOptions{0, 10, ""});
  while (!tuner.done() && job.steps < 1000) job.Step(tuner);
  ASSERT_TRUE(tuner.done());
  EXPECT_EQ(job.lucky_steps_left, 0) << "the lucky candidate was measured";
  EXPECT_EQ(tuner.best(), (TunedParameters{16 * kMiB, microseconds(500)}));
  EXPECT_EQ(job.in_effect, tuner.best());
}

TEST(Autotune, AnUnwritableLogIsAWarningAndTuningGoesOn) {
  // Only rank 0 tunes: an error there would leave the other ranks waiting for it.
  MadeUpJob job;
  Autotuner tuner(job.in_effect, AutotuneOptions{0, 2, "/nonexistent/dir/a.csv"});
  while (!tuner.done() && job.steps < 1000) job.Step(tuner);
  EXPECT_TRUE(tuner.done());
}

TEST(Autotune, NamesThatNeverRepeatEndTheSearchAtTheConfiguredValues) {
  // Unnamed collectives get a fresh name each call: no step ever ends.
  const TunedParameters start{64 * kMiB, microseconds(1000)};
  Autotuner tuner(start, AutotuneOptions{0, 2, ""});
  Clock::time_point now{};
  for (int i = 0; i < 200000 && !tuner.done(); ++i) {
    tuner.Record("allreduce.noname." + std::to_string(i), 4, now);
    EXPECT_FALSE(tuner.EndRound().has_value());
  }
  EXPECT_TRUE(tuner.done());
  EXPECT_EQ(tuner.best(), start);
}

TEST(Autotune, TunedValuesRoundTripAndOutOfRangeOnesAreProtocolErrors) {
  RoundMessage m;
  m.tuned = TunedParameters{4 * kMiB, microseconds(2500)};
  const auto back = DecodeRound(EncodeRound(m), 0);
  ASSERT_TRUE(back.tuned.has_value());
  EXPECT_EQ(*back.tuned, *m.tuned);
  EXPECT_FALSE(DecodeRound(EncodeRound(RoundMessage{}), 0).tuned.has_value());

  m.tuned->cycle_time = microseconds(-1);
  EXPECT_THROW(DecodeRound(EncodeRound(m), 3), ProtocolError);
  m.tuned = TunedParameters{size_t{1} << 40, microseconds(0)};
  EXPECT_THROW(DecodeRound(EncodeRound(m), 3), ProtocolError);
  // Every truncation of a message with values fails cleanly.
  m.tuned = TunedParameters{kMiB, microseconds(1)};
  const std::vector<char> good = EncodeRound(m);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_THROW(DecodeRound(std::vector<char>(good.begin(), good.begin() + n), 1), ProtocolError);
  }
}

}  // namespace
}  // namespace dtrain::collectives
