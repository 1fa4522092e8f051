#include "collectives/engine/autotune.h"

#include <algorithm>
#include <cstdio>

#include "common/logging.h"

namespace dtrain::collectives {

namespace {

constexpr size_t kMiB = size_t{1} << 20;
// More distinct names than this in one step: they do not repeat (autotune.cc's Record).
constexpr size_t kMaxStepNames = 100000;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<size_t> Autotuner::Thresholds(size_t configured) {
  std::vector<size_t> out = {configured};
  for (size_t mb : {1, 4, 16, 64, 128}) {
    if (mb * kMiB != configured) out.push_back(mb * kMiB);
  }
  return out;
}

std::vector<std::chrono::microseconds> Autotuner::CycleTimes(std::chrono::microseconds configured) {
  std::vector<std::chrono::microseconds> out = {configured};
  for (int us : {250, 500, 1000, 2500, 5000}) {
    if (std::chrono::microseconds(us) != configured) out.emplace_back(us);
  }
  return out;
}

Autotuner::Autotuner(TunedParameters start, AutotuneOptions options)
    : options_(std::move(options)),
      start_(start),
      current_(start),
      best_(start),
      thresholds_(Thresholds(start.fusion_threshold_bytes)),
      cycles_(CycleTimes(start.cycle_time)) {
  if (!options_.log_path.empty()) {
    log_.open(options_.log_path, std::ios::out | std::ios::trunc);
    if (log_) {
      log_ << "phase,fusion_threshold_bytes,cycle_time_ms,bytes_per_second,best\n" << std::flush;
    } else {
      // Only rank 0 tunes: failing here would leave the others waiting in their first round.
      DTRAIN_LOG(kWarning) << "autotune: HOROVOD_AUTOTUNE_LOG: cannot write " << options_.log_path
                           << "; tuning without a log";
      log_.close();
    }
  }
  if (options_.warmup_samples <= 0) phase_ = Phase::kThreshold;
}

void Autotuner::Record(const std::string& name, size_t bytes, Clock::time_point now) {
  if (phase_ == Phase::kDone) return;
  if (!sample_start_) sample_start_ = now;
  if (step_names_.count(name) != 0) {  // this name again: a step has ended
    step_names_.clear();
    if (settling_) {
      // The step that straddled a switch is over: measure from here.
      settling_ = false;
      sample_start_ = now;
      bytes_ = 0;
      steps_ = 0;
    } else if (++steps_ >= options_.steps_per_sample) {
      const double seconds = Seconds(now - *sample_start_);
      pending_score_ = seconds > 0 ? static_cast<double>(bytes_) / seconds : 0;
      sample_ended_ = true;
      settling_ = true;  // the values change in the next round, inside the next step
      bytes_ = 0;
      steps_ = 0;
    }
  }
  step_names_.insert(name);
  if (!settling_) bytes_ += bytes;
  if (step_names_.size() > kMaxStepNames) {
    // Unnamed collectives get a new name each call, so no step ever ends: stop, and say why.
    DTRAIN_LOG(kWarning) << "autotune: " << kMaxStepNames
                         << " allreduces without a name coming again; autotune counts training "
                            "steps by names that repeat (name the allreduces, as "
                            "DistributedOptimizer does); keeping the configured values";
    phase_ = Phase::kDone;
    current_ = best_ = start_;
    step_names_.clear();
    sample_ended_ = false;
  }
}

std::optional<TunedParameters> Autotuner::EndRound() {
  if (!sample_ended_) return std::nullopt;
  sample_ended_ = false;
  const TunedParameters before = current_;
  EndSample(pending_score_);
  if (current_ == before) return std::nullopt;
  return current_;
}

void Autotuner::EndSample(double score) {
  switch (phase_) {
    case Phase::kWarmup:
      Log("warmup", score, false);
      if (++samples_ >= options_.warmup_samples) phase_ = Phase::kThreshold;
      return;
    case Phase::kThreshold: {
      Log("threshold", score, Keep(score));
      if (++candidate_ < thresholds_.size()) {
        current_.fusion_threshold_bytes = thresholds_[candidate_];
        return;
      }
      // The configured cycle time at the best threshold is measured already.
      phase_ = Phase::kCycle;
      candidate_ = 1;
      threshold_best_ = best_;
      current_ = best_;
      if (candidate_ < cycles_.size()) current_.cycle_time = cycles_[candidate_];
      return;
    }
    case Phase::kCycle: {
      cycle_scores_.emplace_back(score, current_);
      Log("cycle", score, Keep(score));
      if (++candidate_ < cycles_.size()) {
        current_ = best_;
        current_.cycle_time = cycles_[candidate_];
        return;
      }
      StartConfirm();
      return;
    }
    case Phase::kConfirm:
      Keep(score);
      Log("confirm", score, false);
      if (++candidate_ < confirm_.size() * kConfirmRounds) {
        current_ = confirm_[candidate_ % confirm_.size()];
        return;
      }
      Finish();
      return;
    case Phase::kDone:
      return;
  }
}

std::vector<double>* Autotuner::ScoresOf(const TunedParameters& values) {
  for (auto& [measured, scores] : scores_) {
    if (measured == values) return &scores;
  }
  return nullptr;
}

bool Autotuner::Keep(double score) {
  std::vector<double>* scores = ScoresOf(current_);
  if (!scores) scores = &scores_.emplace_back(current_, std::vector<double>{}).second;
  scores->push_back(score);
  if (score <= best_score_) return false;
  best_ = current_;
  best_score_ = score;
  return true;
}

void Autotuner::StartConfirm() {
  std::vector<TunedParameters> candidates = {start_, threshold_best_};
  // Stable: of equal scores, the cycle time tried first.
  std::stable_sort(cycle_scores_.begin(), cycle_scores_.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < cycle_scores_.size() && i < 2; ++i) {
    candidates.push_back(cycle_scores_[i].second);
  }
  for (const auto& candidate : candidates) {
    if (std::find(confirm_.begin(), confirm_.end(), candidate) == confirm_.end() &&
        ScoresOf(candidate)) {
      confirm_.push_back(candidate);
    }
  }
  if (confirm_.size() < 2) return Finish();  // nothing to choose between
  phase_ = Phase::kConfirm;
  candidate_ = 0;
  current_ = confirm_[0];
}

void Autotuner::Finish() {
  double best_median = -1;
  for (const TunedParameters& values : confirm_) {
    std::vector<double> sorted = *ScoresOf(values);  // each was measured (StartConfirm)
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    if (median > best_median) {
      best_median = median;
      best_ = values;
    }
  }
  if (best_median >= 0) best_score_ = best_median;
  phase_ = Phase::kDone;
  current_ = best_;
  DTRAIN_LOG(kInfo) << "autotune: fusion threshold " << best_.fusion_threshold_bytes
                    << " bytes, cycle time " << best_.cycle_time.count() / 1000.0 << " ms ("
                    << best_score_ / 1e6 << " MB/s of allreduces, the median of its samples)";
  Log("best", best_score_, true);
}

void Autotuner::Log(const char* phase, double score, bool chosen) {
  if (!log_.is_open()) return;
  char line[160];
  std::snprintf(line, sizeof line, "%s,%zu,%.3f,%.0f,%d\n", phase, current_.fusion_threshold_bytes,
                current_.cycle_time.count() / 1000.0, score, chosen ? 1 : 0);
  log_ << line << std::flush;
}

}  // namespace dtrain::collectives
