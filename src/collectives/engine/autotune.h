// Horovod's autotune (HOROVOD_AUTOTUNE=1, `dtrain launch --autotune`): the fusion threshold and
// the cycle time chosen online from the throughput the job itself reaches.
//
// Rank 0 tunes; every rank follows. The tuner sees each allreduce the engine runs (its name and
// bytes) and counts training steps: a step ends when a name comes again, since a step reduces
// each gradient once. After `warmup_samples` samples at the configured values (the first steps
// are slow for other reasons), it measures one sample of `steps_per_sample` steps per candidate:
// first the fusion thresholds at the configured cycle time, then the cycle times at the best
// threshold (a coordinate search: the two interact little, and it converges in a bounded number
// of steps, some 200 with the defaults, where a Bayesian search needs more samples to trust its
// model). A sample's score is the bytes reduced per second of wall time, so that it moves with the
// whole step's time, not only the collectives'. One sample is noisy on a busy host (the same
// values scored 61 to 93 MB/s on two cores, where the best cycle time gains 10%), so the search
// ends with a confirmation: the configured values, the best threshold found and the two best
// cycle times found get `kConfirmRounds` more samples each, interleaved (a slow spell of the host
// hits them alike), and the best median of each one's samples wins. Each change is
// announced in rank 0's next negotiation message, and every rank switches in the round that
// carries it (negotiation.h), so the ranks never plan a fusion batch with different thresholds.
//
// Internal to src/collectives/engine. Single-threaded: the engine's background thread owns it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

struct TunedParameters {
  size_t fusion_threshold_bytes = 0;
  std::chrono::microseconds cycle_time{0};
  bool operator==(const TunedParameters&) const = default;
};

struct AutotuneOptions {
  int warmup_samples = 3;     // HOROVOD_AUTOTUNE_WARMUP_SAMPLES
  int steps_per_sample = 10;  // HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE
  std::string log_path;       // HOROVOD_AUTOTUNE_LOG: one CSV line per sample; "" = none
};

class Autotuner {
 public:
  // Starts at `start` (the configured values, also the first candidates). A log that cannot be
  // written is a warning: the job tunes without it.
  Autotuner(TunedParameters start, AutotuneOptions options);

  // One allreduce run by this rank: its name and its bytes.
  void Record(const std::string& name, size_t bytes, Clock::time_point now);
  // At the end of a round: the values to switch to, when a sample ended and they change.
  std::optional<TunedParameters> EndRound();

  bool done() const { return phase_ == Phase::kDone; }
  const TunedParameters& best() const { return best_; }
  const TunedParameters& current() const { return current_; }

  // The candidates, in the order they are tried (the configured value first).
  static std::vector<size_t> Thresholds(size_t configured);
  static std::vector<std::chrono::microseconds> CycleTimes(std::chrono::microseconds configured);

 private:
  enum class Phase { kWarmup, kThreshold, kCycle, kConfirm, kDone };
  // How many more samples the confirmation takes of each of its candidates.
  static constexpr size_t kConfirmRounds = 2;

  void EndSample(double score);
  // Whether the current values scored best so far (then they are the best); every score is kept.
  bool Keep(double score);
  // The scores of `values` so far; null when they were not measured.
  std::vector<double>* ScoresOf(const TunedParameters& values);
  // The confirmation's candidates into confirm_, the first of them on.
  void StartConfirm();
  // The confirmed candidate with the best median score becomes the best; the search ends.
  void Finish();
  void Log(const char* phase, double score, bool chosen);

  const AutotuneOptions options_;
  Phase phase_ = Phase::kWarmup;
  const TunedParameters start_;
  TunedParameters current_, best_;
  double best_score_ = -1;
  std::vector<size_t> thresholds_;
  std::vector<std::chrono::microseconds> cycles_;
  size_t candidate_ = 0;  // index into the phase's candidates
  // Every candidate measured, with its scores (bytes per second), in the order first measured.
  std::vector<std::pair<TunedParameters, std::vector<double>>> scores_;
  // The threshold phase's best candidate, and the cycle phase's candidates with their scores (the
  // configured cycle time is the threshold phase's).
  TunedParameters threshold_best_;
  std::vector<std::pair<double, TunedParameters>> cycle_scores_;
  std::vector<TunedParameters> confirm_;
  int samples_ = 0;  // warmup samples taken

  // The sample under way: a settling step after each switch is not counted.
  bool settling_ = false;
  std::unordered_set<std::string> step_names_;
  int steps_ = 0;
  size_t bytes_ = 0;
  std::optional<Clock::time_point> sample_start_;
  bool sample_ended_ = false;
  double pending_score_ = 0;

  std::ofstream log_;
};

}  // namespace dtrain::collectives
