#include "optim/elementwise_optimizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/cuda.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

constexpr char kMagic[4] = {'D', 'T', 'O', 'S'};
// Version 2 adds the rate changes; a state without any is written as version 1.
constexpr uint32_t kVersion = 1;
constexpr uint32_t kVersionWithRateChanges = 2;
constexpr size_t kMaxNameBytes = 64;
// Counts beyond 2^53 would lose their last bit in the schedules' double arithmetic; no training
// gets near it, so a larger one in saved state is damage.
constexpr uint64_t kMaxUpdateCount = uint64_t{1} << 53;
// index, update count, length
constexpr size_t kIndexHeaderBytes = 3 * sizeof(uint64_t);

std::vector<std::string_view> WithCommonParams(std::vector<std::string_view> own) {
  own.insert(own.begin(), "learning_rate");
  own.insert(own.end(), LearningRateSchedule::kParamNames.begin(),
             LearningRateSchedule::kParamNames.end());
  own.push_back("lazy_update");
  return own;
}

// ---- Little-endian encoding, whatever the host's order ----

class StateWriter {
 public:
  explicit StateWriter(size_t size) { out_.reserve(size); }

  void Bytes(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void F64(double v) { U64(std::bit_cast<uint64_t>(v)); }
  void Floats(std::span<const float> v) {
    if (v.empty()) return;
    if constexpr (std::endian::native == std::endian::little) {
      Bytes(v.data(), v.size() * sizeof(float));
    } else {
      for (float f : v) U32(std::bit_cast<uint32_t>(f));
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads untrusted bytes: every read checks what is left first and names what it was reading.
class StateReader {
 public:
  explicit StateReader(std::string_view data) : data_(data) {}

  size_t left() const { return data_.size() - pos_; }
  size_t pos() const { return pos_; }

  const char* Take(size_t n, const char* what) {
    if (n > left()) {
      throw InvalidArgument("optimizer state is cut short: " + std::string(what) + " needs " +
                            std::to_string(n) + " bytes at offset " + std::to_string(pos_) + ", " +
                            std::to_string(left()) + " left");
    }
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint32_t U32(const char* what) {
    const auto* p = reinterpret_cast<const unsigned char*>(Take(4, what));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
    return v;
  }
  uint64_t U64(const char* what) {
    const auto* p = reinterpret_cast<const unsigned char*>(Take(8, what));
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
    return v;
  }
  double F64(const char* what) { return std::bit_cast<double>(U64(what)); }
  void Floats(float* out, size_t n, const char* what) {
    const char* p = Take(n * sizeof(float), what);
    if (n == 0) return;  // `out` may be null
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(out, p, n * sizeof(float));
    } else {
      StateReader floats(std::string_view(p, n * sizeof(float)));
      for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(floats.U32(what));
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace

ElementwiseOptimizer::ElementwiseOptimizer(OptimizerSpec spec, std::string_view state_name,
                                           std::vector<std::string_view> own_params,
                                           double default_learning_rate)
    : spec_(std::move(spec)),
      state_name_(state_name),
      params_(spec_, WithCommonParams(std::move(own_params))) {
  params_.NonNegative("learning_rate", static_cast<float>(default_learning_rate));
  learning_rate_ = params_.Exact("learning_rate", default_learning_rate);
  lazy_update_ = params_.Flag("lazy_update", true);
  schedule_ = LearningRateSchedule::FromSpec(spec_, params_, learning_rate_);
}

namespace {
// `learning_rate` checked as the spec's would be (InvalidArgument naming it).
double CheckedRate(const std::string& name, double learning_rate) {
  OptimizerSpec probe{name, {{"learning_rate", learning_rate}}};
  const OptimizerParams check(probe, {"learning_rate"});
  check.NonNegative("learning_rate", 0.f);
  return check.Exact("learning_rate", 0.0);
}
}  // namespace

void ElementwiseOptimizer::set_learning_rate(double learning_rate) {
  const double rate = CheckedRate(spec_.name, learning_rate);
  std::lock_guard<std::mutex> lock(rate_mutex_);
  rate_changes_.clear();
  learning_rate_ = rate;
}

void ElementwiseOptimizer::set_learning_rate_from(uint64_t t, double learning_rate) {
  if (t == 0 || t > kMaxUpdateCount) {
    throw InvalidArgument("optimizer '" + spec_.name + "': a rate change from update " +
                          std::to_string(t) + " (updates are numbered 1 to 2^53)");
  }
  const double rate = CheckedRate(spec_.name, learning_rate);
  std::lock_guard<std::mutex> lock(rate_mutex_);
  while (!rate_changes_.empty() && rate_changes_.back().first >= t) rate_changes_.pop_back();
  rate_changes_.emplace_back(t, rate);
}

double ElementwiseOptimizer::learning_rate() const {
  std::lock_guard<std::mutex> lock(rate_mutex_);
  return rate_changes_.empty() ? learning_rate_ : rate_changes_.back().second;
}

double ElementwiseOptimizer::BaseRateAt(uint64_t t) const {
  std::lock_guard<std::mutex> lock(rate_mutex_);
  for (auto it = rate_changes_.rbegin(); it != rate_changes_.rend(); ++it) {
    if (it->first <= t) return it->second;
  }
  return learning_rate_;
}

double ElementwiseOptimizer::LearningRateAt(uint64_t t) const {
  return schedule_.RateAt(BaseRateAt(t), t);
}

uint64_t ElementwiseOptimizer::UpdateCount(uint64_t index) const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  auto it = state_.find(index);
  return it == state_.end() ? 0 : it->second.update_count;
}

ElementwiseOptimizer::IndexState& ElementwiseOptimizer::StateOf(uint64_t index, size_t n) {
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    auto it = state_.find(index);
    if (it != state_.end()) {
      if (it->second.length != n) {
        throw InvalidArgument(IndexName(index) + " has state for " +
                              std::to_string(it->second.length) + " elements but was given " +
                              std::to_string(n));
      }
      return it->second;
    }
  }
  // Zero-fill a big state outside the lock so that updates of other indexes need not wait. No
  // other thread adds this index meanwhile: Update never runs twice at once for one index.
  IndexState fresh{0, n, std::vector<float>(state_buffers_ * n, 0.f), Array()};
  std::lock_guard<std::mutex> lock(state_mutex_);
  return state_.try_emplace(index, std::move(fresh)).first->second;
}

std::string ElementwiseOptimizer::IndexName(uint64_t index) const {
  return "optimizer '" + spec_.name + "': index " + std::to_string(index);
}

void ElementwiseOptimizer::CheckLengths(uint64_t index, size_t weights, size_t grads) const {
  if (weights != grads) {
    throw InvalidArgument(IndexName(index) + " has " + std::to_string(weights) + " weights but " +
                          std::to_string(grads) + " gradients");
  }
}

void ElementwiseOptimizer::Update(uint64_t index, std::span<float> weight,
                                  std::span<const float> grad) {
  CheckLengths(index, weight.size(), grad.size());
  IndexState& state = StateOf(index, weight.size());
  // As MXNet's _update_count: the count goes up before the schedule (and Adam) read it.
  const uint64_t t = state.update_count + 1;
  const Step step{t, LearningRateAt(t)};
  const size_t n = weight.size();
  float* const buffers = HostBuffers(state);
  if (!parallel_for_) {
    Apply(step, weight, grad, {buffers, n});
  } else {
    parallel_for_(static_cast<int64_t>(n), [&](int64_t begin, int64_t end) {
      const auto b = static_cast<size_t>(begin), count = static_cast<size_t>(end - begin);
      // A rule without state (SGD without momentum) has no buffers to offset into.
      Apply(step, weight.subspan(b, count), grad.subspan(b, count),
            {buffers ? buffers + b : nullptr, n});
    });
  }
  state.update_count = t;
}

void ElementwiseOptimizer::UpdateRows(uint64_t index, std::span<float> weight, size_t row_length,
                                      std::span<const int64_t> rows, std::span<const float> grad) {
  if (row_length == 0 || weight.size() % row_length != 0) {
    throw InvalidArgument(IndexName(index) + ": rows of " + std::to_string(row_length) +
                          " elements do not divide a weight of " + std::to_string(weight.size()));
  }
  const auto row_count = static_cast<int64_t>(weight.size() / row_length);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= row_count || (i > 0 && rows[i] <= rows[i - 1])) {
      throw InvalidArgument(IndexName(index) + ": row " + std::to_string(rows[i]) + " at " +
                            std::to_string(i) + " is " +
                            (rows[i] < 0 || rows[i] >= row_count
                                 ? "outside the weight's " + std::to_string(row_count) + " rows"
                                 : "not above the row before it (rows must increase)"));
    }
  }
  if (grad.size() != rows.size() * row_length) {
    throw InvalidArgument(IndexName(index) + ": a gradient of " + std::to_string(grad.size()) +
                          " elements for " + std::to_string(rows.size()) + " rows of " +
                          std::to_string(row_length));
  }
  IndexState& state = StateOf(index, weight.size());
  const uint64_t t = state.update_count + 1;
  const Step step{t, LearningRateAt(t)};
  const size_t n = weight.size();
  float* const buffers = HostBuffers(state);
  auto apply = [&](int64_t begin, int64_t end) {
    for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
      const size_t first = static_cast<size_t>(rows[i]) * row_length;
      Apply(step, weight.subspan(first, row_length), grad.subspan(i * row_length, row_length),
            {buffers ? buffers + first : nullptr, n});
    }
  };
  if (parallel_for_) {
    parallel_for_(static_cast<int64_t>(rows.size()), apply);
  } else {
    apply(0, static_cast<int64_t>(rows.size()));
  }
  state.update_count = t;
}

void ElementwiseOptimizer::UpdateOnDevice(uint64_t index, const Array& weight, const Array& grad) {
  if (!weight.on_device() || !grad.on_device()) {
    throw InvalidArgument(IndexName(index) + ": UpdateOnDevice takes values on a device (the " +
                          (weight.on_device() ? "gradient" : "weight") +
                          " is on the host); Update takes host values");
  }
  if (weight.device() != grad.device()) {
    throw InvalidArgument(IndexName(index) + ": the weight is on device " +
                          std::to_string(weight.device()) + " and the gradient on device " +
                          std::to_string(grad.device()));
  }
  if (weight.dtype() != DType::kFloat32 || grad.dtype() != DType::kFloat32) {
    throw InvalidArgument(IndexName(index) + ": the optimizer updates float32 values only");
  }
  const auto n = static_cast<size_t>(weight.size());
  CheckLengths(index, n, static_cast<size_t>(grad.size()));
  IndexState& state = StateOf(index, n);
  const uint64_t t = state.update_count + 1;
  const Step step{t, LearningRateAt(t)};
  cuda::OrderAfter(grad, weight);  // the gradient may come from another stream (a pull's copy)
  kernels::DeviceTarget target;
  target.device = weight.device();
  target.stream = weight.stream();
  target.weight = static_cast<float*>(weight.data());
  target.grad = static_cast<const float*>(grad.data());
  target.n = n;
  float* const buffers = DeviceBuffers(state, weight.device(), weight.stream());
  static_assert(std::size(kernels::DeviceTarget{}.state) == 3, "the rules keep at most 3 buffers");
  for (size_t k = 0; k < state_buffers_; ++k) target.state[k] = buffers + k * n;
  ApplyOnDevice(step, target);
  state.update_count = t;
}

float* ElementwiseOptimizer::HostBuffers(IndexState& state) {
  if (state.on_device.defined()) {
    const Array host = cuda::ToHost(state.on_device);  // waits for the updates queued there
    state.buffers.assign(static_cast<const float*>(host.data()),
                         static_cast<const float*>(host.data()) + host.size());
    state.on_device = Array();
  }
  return state.buffers.data();
}

float* ElementwiseOptimizer::DeviceBuffers(IndexState& state, int device, void* stream) {
  if (state_buffers_ == 0) return nullptr;
  if (state.on_device.defined() && state.on_device.device() != device) HostBuffers(state);
  if (!state.on_device.defined()) {
    const auto count = static_cast<int64_t>(state_buffers_ * state.length);
    state.on_device = cuda::NewOnDevice(device, Shape{count}, DType::kFloat32,
                                        state.buffers.empty() ? nullptr : state.buffers.data());
    std::vector<float>().swap(state.buffers);
  }
  const Array last = state.on_device;
  state.on_device =
      Array::WrapDevice(last.data(), last.shape(), last.dtype(), device, stream, last.owner());
  // An update on another stream than the last one (a user's torch.cuda.stream, another thread's
  // current stream) must not start before the last one has finished with these buffers.
  if (last.stream() != stream) cuda::OrderAfter(last, state.on_device);
  return static_cast<float*>(state.on_device.data());
}

// ---- Saved state ----

std::string ElementwiseOptimizer::SaveState() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  std::vector<std::pair<uint64_t, double>> changes;
  double base_rate = 0;
  {
    std::lock_guard<std::mutex> rate_lock(rate_mutex_);
    changes = rate_changes_;
    base_rate = learning_rate_;
  }
  std::vector<const StateTable::value_type*> entries;
  entries.reserve(state_.size());
  size_t size = sizeof(kMagic) + 4 + 4 + state_name_.size() + 4 + 8 + 8;
  if (!changes.empty()) size += 8 + changes.size() * 16;
  for (const auto& entry : state_) {
    entries.push_back(&entry);
    size += kIndexHeaderBytes + state_buffers_ * entry.second.length * sizeof(float);
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });

  StateWriter out(size);
  out.Bytes(kMagic, sizeof(kMagic));
  out.U32(changes.empty() ? kVersion : kVersionWithRateChanges);
  out.U32(static_cast<uint32_t>(state_name_.size()));
  out.Bytes(state_name_.data(), state_name_.size());
  out.U32(static_cast<uint32_t>(state_buffers_));
  out.F64(base_rate);
  if (!changes.empty()) {
    out.U64(changes.size());
    for (const auto& [t, rate] : changes) {
      out.U64(t);
      out.F64(rate);
    }
  }
  out.U64(entries.size());
  for (const auto* entry : entries) {
    out.U64(entry->first);
    out.U64(entry->second.update_count);
    out.U64(entry->second.length);
    if (entry->second.on_device.defined()) {
      const Array host = cuda::ToHost(entry->second.on_device);
      out.Floats({static_cast<const float*>(host.data()), static_cast<size_t>(host.size())});
    } else {
      out.Floats(entry->second.buffers);
    }
  }
  return out.Take();
}

void ElementwiseOptimizer::BadState(const std::string& why) const {
  throw InvalidArgument("optimizer '" + spec_.name + "' cannot load this state: " + why);
}

void ElementwiseOptimizer::LoadState(const std::string& bytes) {
  StateReader in(bytes);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    BadState("it does not start with the magic \"DTOS\" of saved optimizer state");
  }
  in.Take(sizeof(kMagic), "the magic");
  const uint32_t version = in.U32("the version");
  if (version != kVersion && version != kVersionWithRateChanges) {
    BadState("it is version " + std::to_string(version) + "; this build reads versions " +
             std::to_string(kVersion) + " and " + std::to_string(kVersionWithRateChanges));
  }
  const uint32_t name_bytes = in.U32("the name's length");
  if (name_bytes == 0 || name_bytes > kMaxNameBytes) {
    BadState("its name is " + std::to_string(name_bytes) + " bytes long (1 to " +
             std::to_string(kMaxNameBytes) + " expected)");
  }
  const std::string_view name(in.Take(name_bytes, "the name"), name_bytes);
  if (name != state_name_) {
    // Only printable names are quoted back: the bytes may be anything.
    const bool printable = std::all_of(name.begin(), name.end(), [](char c) {
      return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
    });
    BadState(
        "it is the state of " +
        (printable ? "optimizer '" + std::string(name) + "'" : std::string("another optimizer")) +
        ", this is '" + state_name_ + "'");
  }
  const uint32_t buffers = in.U32("the number of buffers");
  if (buffers != state_buffers_) {
    BadState("it keeps " + std::to_string(buffers) + " state buffers per element, this '" +
             state_name_ + "' keeps " + std::to_string(state_buffers_) +
             " (a different variant or momentum setting)");
  }
  auto read_rate = [&](const char* what) {
    const double rate = in.F64(what);
    if (!std::isfinite(rate) || rate < 0 || rate > std::numeric_limits<float>::max()) {
      BadState("its " + std::string(what) + " " + std::to_string(rate) +
               " is not a finite float32 number >= 0");
    }
    return rate;
  };
  const double learning_rate = read_rate("learning rate");
  std::vector<std::pair<uint64_t, double>> changes;
  if (version == kVersionWithRateChanges) {
    const uint64_t n = in.U64("the number of rate changes");
    if (n == 0 || n > in.left() / 16) {
      BadState("it claims " + std::to_string(n) + " rate changes (1 to what the " +
               std::to_string(in.left()) + " bytes left hold)");
    }
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t t = in.U64("a rate change's update");
      if (t == 0 || t > kMaxUpdateCount || (!changes.empty() && t <= changes.back().first)) {
        BadState("a rate change from update " + std::to_string(t) +
                 " (updates 1 to 2^53, increasing)");
      }
      changes.emplace_back(t, read_rate("changed learning rate"));
    }
  }
  const uint64_t count = in.U64("the number of indexes");
  if (count > in.left() / kIndexHeaderBytes) {
    BadState("it claims " + std::to_string(count) + " indexes but has only " +
             std::to_string(in.left()) + " bytes left");
  }

  StateTable table;
  table.reserve(static_cast<size_t>(count));
  uint64_t previous = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t index = in.U64("an index");
    if (i > 0 && index <= previous) {
      BadState("index " + std::to_string(index) + " follows index " + std::to_string(previous) +
               " (indexes must be increasing)");
    }
    previous = index;
    IndexState state;
    state.update_count = in.U64("an update count");
    if (state.update_count > kMaxUpdateCount) {
      BadState("index " + std::to_string(index) + " claims " + std::to_string(state.update_count) +
               " updates, more than 2^53");
    }
    const uint64_t length = in.U64("a length");
    // Checked before anything is allocated: the floats must be there.
    if (buffers > 0 && length > in.left() / (buffers * sizeof(float))) {
      BadState("index " + std::to_string(index) + " claims " + std::to_string(length) +
               " elements of state but only " + std::to_string(in.left()) + " bytes are left");
    }
    if (length > std::numeric_limits<size_t>::max()) BadState("a length does not fit in memory");
    state.length = static_cast<size_t>(length);
    state.buffers.resize(buffers * state.length);
    in.Floats(state.buffers.data(), state.buffers.size(), "the state buffers");
    table.emplace(index, std::move(state));
  }
  if (in.left() != 0) {
    BadState(std::to_string(in.left()) + " bytes follow the end of the state at offset " +
             std::to_string(in.pos()));
  }

  std::lock_guard<std::mutex> lock(state_mutex_);
  state_.swap(table);
  std::lock_guard<std::mutex> rate_lock(rate_mutex_);
  learning_rate_ = learning_rate;
  rate_changes_ = std::move(changes);
}

}  // namespace dtrain
