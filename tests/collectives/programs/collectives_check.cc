// A rank of a collectives job that checks results end to end, for tests/collectives. Started as N
// real processes: by hand for gloo (DTRAIN_NODE_RANK, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI/PORT or
// DTRAIN_GLOO_FILE_STORE) or under mpirun.
//
//   collectives_check --scenario exact --max-elements N   allreduce (every op), allgather,
//                                                          broadcast, alltoall, reducescatter
//                                                          results exact, tensors submitted in a
//                                                          different order on every rank
//   collectives_check --scenario fusion                   100 small allreduces share backend calls
//   collectives_check --scenario fp16                     DTRAIN_FP16_ALLREDUCE: close results
//   collectives_check --scenario die --pid-dir D          allreduces forever; the test kills a
//                    [--elements N]                        rank, the others must fail naming it
//   collectives_check --scenario stall --late-rank 1      rank 1 submits 3 s late
//   collectives_check --scenario mismatch                 one name, a different shape per rank
//   collectives_check --scenario timeout --late-rank 1    rank 1 never submits; Wait times out
//
// Values are small integers, so sums are exact in every dtype used. Exit codes: 0 success,
// 1 a wrong value, 2 an unexpected error, 3 the expected error (printed) in die/mismatch/timeout.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives_internal.h"
#include "common/elementwise.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/error.h"

namespace {

namespace coll = dtrain::collectives;
using dtrain::Array;
using dtrain::DType;

struct Options {
  std::string scenario = "exact";
  int64_t max_elements = 1 << 20;
  int late_rank = 1;
  std::string pid_dir;
  int64_t elements = 4096;  // die: the allreduced tensor
};

int g_rank = 0;

void Say(const std::string& line) {
  std::printf("[rank %d] %s\n", g_rank, line.c_str());
  std::fflush(stdout);
}

struct WrongValue : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads element i of an array of any dtype used here as a double.
double At(const Array& a, int64_t i) {
  switch (a.dtype()) {
    case DType::kFloat32:
      return static_cast<const float*>(a.data())[i];
    case DType::kFloat64:
      return static_cast<const double*>(a.data())[i];
    case DType::kBFloat16:  // the top half of a float32
      return std::bit_cast<float>(static_cast<uint32_t>(static_cast<const uint16_t*>(a.data())[i])
                                  << 16);
    default:
      return dtrain::HalfToFloat(static_cast<const uint16_t*>(a.data())[i]);
  }
}

void Set(const Array& a, int64_t i, double v) {
  switch (a.dtype()) {
    case DType::kFloat32:
      static_cast<float*>(a.data())[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(a.data())[i] = v;
      break;
    case DType::kBFloat16:  // small integers: exact, no rounding to do
      static_cast<uint16_t*>(a.data())[i] =
          static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16);
      break;
    default:
      static_cast<uint16_t*>(a.data())[i] = dtrain::FloatToHalf(static_cast<float>(v));
  }
}

void Expect(const std::string& what, const Array& a, const std::function<double(int64_t)>& want,
            double tolerance = 0) {
  for (int64_t i = 0; i < a.size(); ++i) {
    const double got = At(a, i);
    const double w = want(i);
    if (std::abs(got - w) > tolerance * std::max(1.0, std::abs(w))) {
      throw WrongValue(what + ": element " + std::to_string(i) + " is " + std::to_string(got) +
                       ", expected " + std::to_string(w));
    }
  }
}

// One collective of the exact scenario: submitted with `submit`, checked with `check`.
struct Case {
  std::string name;
  std::function<void()> reset;  // refills the input (an in-place collective overwrote it)
  std::function<coll::Handle()> submit;
  std::function<void(const coll::Handle&)> check;
};

// Element i of rank r's allreduce input: small integers whose sum over ranks is exact.
double Value(int rank, int64_t i, int modulus) { return (rank + 1) * (i % modulus + 1); }

void AddAllreduce(std::vector<Case>* cases, int64_t n, DType dtype, coll::ReduceOp op,
                  bool in_place) {
  const int size = coll::Size();
  const int modulus = dtype == DType::kFloat16 ? 8 : 1000;  // float16: sums stay below 2048
  const std::string name =
      "allreduce." + std::to_string(n) + "." + std::string(dtrain::DTypeName(dtype)) +
      (op == coll::ReduceOp::kSum ? ".sum" : ".avg") + (in_place ? ".inplace" : "");
  Array in({n}, dtype);
  Array out = in_place ? in : Array({n}, dtype);
  const double ranks_sum = size * (size + 1) / 2.0;
  const double scale = op == coll::ReduceOp::kSum ? ranks_sum : ranks_sum / size;
  cases->push_back({name,
                    [=] {
                      for (int64_t i = 0; i < n; ++i) Set(in, i, Value(g_rank, i, modulus));
                    },
                    [=] { return coll::AllreduceAsync(name, in, out, op); },
                    [=](const coll::Handle&) {
                      // Averages of integers divide by the rank count: exact up to the one
                      // rounding.
                      const double tolerance = op == coll::ReduceOp::kSum ? 0 : 1e-6;
                      Expect(
                          name, out, [&](int64_t i) { return scale * (i % modulus + 1); },
                          tolerance);
                      if (!in_place)
                        Expect(name + " (input untouched)", in,
                               [&](int64_t i) { return Value(g_rank, i, modulus); });
                    }});
}

void AddAllgather(std::vector<Case>* cases, int64_t cols, DType dtype) {
  const int size = coll::Size();
  const std::string name =
      "allgather." + std::to_string(cols) + "." + std::string(dtrain::DTypeName(dtype));
  // Rank r contributes r + 1 rows (a different first dimension on every rank).
  const int64_t rows = g_rank + 1;
  Array in({rows, cols}, dtype);
  auto value = [cols](int rank, int64_t row, int64_t col) {
    return static_cast<double>((rank * 7 + row * 3 + col) % 1000);
  };
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t c = 0; c < cols; ++c) Set(in, row * cols + c, value(g_rank, row, c));
  }
  cases->push_back({name, [] {}, [=] { return coll::AllgatherAsync(name, in); },
                    [=](const coll::Handle& h) {
                      const Array out = h.result();
                      const int64_t total_rows = size * (size + 1) / 2;
                      if (out.shape() != dtrain::Shape{total_rows, cols} || out.dtype() != dtype) {
                        throw WrongValue(name + ": result shape " +
                                         dtrain::ShapeToString(out.shape()));
                      }
                      int64_t row = 0;
                      for (int r = 0; r < size; ++r) {
                        for (int64_t k = 0; k <= r; ++k, ++row) {
                          for (int64_t c = 0; c < cols; ++c) {
                            if (At(out, row * cols + c) != value(r, k, c)) {
                              throw WrongValue(name + ": row " + std::to_string(row) + " col " +
                                               std::to_string(c));
                            }
                          }
                        }
                      }
                    }});
}

void AddBroadcast(std::vector<Case>* cases, int64_t n, DType dtype) {
  const int root = coll::Size() - 1;  // not rank 0, to catch a root taken for granted
  const std::string name =
      "broadcast." + std::to_string(n) + "." + std::string(dtrain::DTypeName(dtype));
  Array data({n}, dtype);
  auto value = [root](int64_t i) { return static_cast<double>((i * 13 + root) % 1000); };
  cases->push_back({name,
                    [=] {
                      for (int64_t i = 0; i < n; ++i)
                        Set(data, i, g_rank == root ? value(i) : -1.0);
                    },
                    [=] { return coll::BroadcastAsync(name, data, root); },
                    [=](const coll::Handle&) { Expect(name, data, value); }});
}

// Min, Max and Product: rank r holds ((r + i) % size + 1) * (i % 5 + 1), so that every rank
// holds the extreme somewhere and the product is size! * (i % 5 + 1)^size, exact in every dtype.
void AddExtreme(std::vector<Case>* cases, int64_t n, DType dtype, coll::ReduceOp op) {
  const int size = coll::Size();
  const char* op_name = op == coll::ReduceOp::kMin   ? "min"
                        : op == coll::ReduceOp::kMax ? "max"
                                                     : "product";
  const std::string name = "allreduce." + std::to_string(n) + "." +
                           std::string(dtrain::DTypeName(dtype)) + "." + op_name;
  Array data({n}, dtype);
  auto want = [=](int64_t i) {
    const double scale = static_cast<double>(i % 5 + 1);
    if (op == coll::ReduceOp::kMin) return scale;
    if (op == coll::ReduceOp::kMax) return size * scale;
    double product = 1;
    for (int r = 1; r <= size; ++r) product *= r * scale;
    return product;
  };
  cases->push_back({name,
                    [=] {
                      for (int64_t i = 0; i < n; ++i)
                        Set(data, i, ((g_rank + i) % size + 1) * static_cast<double>(i % 5 + 1));
                    },
                    [=] { return coll::AllreduceAsync(name, data, data, op); },
                    [=](const coll::Handle&) { Expect(name, data, want); }});
}

// Rank s sends (s + k) % 3 rows to rank k (none to some), each row holding s, k and its index.
void AddAlltoall(std::vector<Case>* cases, int64_t cols, DType dtype) {
  const int size = coll::Size();
  const std::string name =
      "alltoall." + std::to_string(cols) + "." + std::string(dtrain::DTypeName(dtype));
  auto rows_to = [](int sender, int receiver) {
    return static_cast<int64_t>((sender + receiver) % 3);
  };
  auto value = [](int sender, int receiver, int64_t row, int64_t col) {
    return static_cast<double>(sender * 100 + receiver * 10 + row * 3 + col % 5);
  };
  std::vector<int64_t> splits;
  int64_t rows = 0;
  for (int k = 0; k < size; ++k) {
    splits.push_back(rows_to(g_rank, k));
    rows += splits.back();
  }
  Array in({rows, cols}, dtype);
  for (int k = 0, row = 0; k < size; ++k) {
    for (int64_t j = 0; j < splits[k]; ++j, ++row) {
      for (int64_t c = 0; c < cols; ++c) Set(in, row * cols + c, value(g_rank, k, j, c));
    }
  }
  cases->push_back(
      {name, [] {}, [=] { return coll::AlltoallAsync(name, in, splits); },
       [=](const coll::Handle& h) {
         const Array out = h.result();
         const std::vector<int64_t> received = h.received_rows();
         int64_t row = 0;
         for (int s = 0; s < size; ++s) {
           if (received.size() != static_cast<size_t>(size) || received[s] != rows_to(s, g_rank)) {
             throw WrongValue(name + ": received rows " + dtrain::ShapeToString(received));
           }
           for (int64_t j = 0; j < received[s]; ++j, ++row) {
             for (int64_t c = 0; c < cols; ++c) {
               if (At(out, row * cols + c) != value(s, g_rank, j, c)) {
                 throw WrongValue(name + ": row " + std::to_string(row) + " col " +
                                  std::to_string(c) + " from rank " + std::to_string(s));
               }
             }
           }
         }
         if (out.shape() != dtrain::Shape{row, cols}) {
           throw WrongValue(name + ": result shape " + dtrain::ShapeToString(out.shape()));
         }
       }});
}

// `rows` rows of `cols`, summed (or averaged) over ranks; this rank keeps its share of the rows,
// the lower ranks one more when the ranks do not divide them.
void AddReducescatter(std::vector<Case>* cases, int64_t rows, int64_t cols, DType dtype,
                      coll::ReduceOp op) {
  const int size = coll::Size();
  const std::string name = "reducescatter." + std::to_string(rows) + "x" + std::to_string(cols) +
                           "." + std::string(dtrain::DTypeName(dtype)) +
                           (op == coll::ReduceOp::kSum ? ".sum" : ".avg");
  const int modulus = 100;
  Array in({rows, cols}, dtype);
  for (int64_t i = 0; i < rows * cols; ++i) Set(in, i, Value(g_rank, i, modulus));
  const double ranks_sum = size * (size + 1) / 2.0;
  const double scale = op == coll::ReduceOp::kSum ? ranks_sum : ranks_sum / size;
  const int64_t share = rows / size + (g_rank < rows % size ? 1 : 0);
  const int64_t first = g_rank * (rows / size) + std::min<int64_t>(g_rank, rows % size);
  cases->push_back(
      {name, [] {}, [=] { return coll::ReducescatterAsync(name, in, op); },
       [=](const coll::Handle& h) {
         const Array out = h.result();
         if (out.shape() != dtrain::Shape{share, cols}) {
           throw WrongValue(name + ": result shape " + dtrain::ShapeToString(out.shape()));
         }
         Expect(
             name, out, [&](int64_t i) { return scale * ((first * cols + i) % modulus + 1); },
             op == coll::ReduceOp::kSum ? 0 : 1e-6);
       }});
}

int Exact(const Options& o) {
  std::vector<Case> cases;
  std::vector<int64_t> sizes;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{65539}, int64_t{1} << 20,
                    int64_t{1} << 22, int64_t{1} << 24}) {
    if (n <= o.max_elements) sizes.push_back(n);
  }
  for (int64_t n : sizes) {
    AddAllreduce(&cases, n, DType::kFloat32, coll::ReduceOp::kSum, false);
    AddAllreduce(&cases, n, DType::kFloat32, coll::ReduceOp::kAverage, true);
    if (n <= (1 << 20)) {
      AddAllreduce(&cases, n, DType::kFloat64, coll::ReduceOp::kSum, true);
      AddAllreduce(&cases, n, DType::kFloat16, coll::ReduceOp::kSum, false);
      AddAllreduce(&cases, n, DType::kFloat64, coll::ReduceOp::kAverage, false);
      AddBroadcast(&cases, n, n % 2 ? DType::kFloat64 : DType::kFloat32);
      AddAllgather(&cases, n, DType::kFloat32);
    }
    if (n <= 65539) {
      for (auto op : {coll::ReduceOp::kMin, coll::ReduceOp::kMax, coll::ReduceOp::kProduct}) {
        AddExtreme(&cases, n, n % 2 ? DType::kFloat32 : DType::kFloat64, op);
      }
      AddExtreme(&cases, n, DType::kFloat16, coll::ReduceOp::kMax);
      AddExtreme(&cases, n, DType::kBFloat16, coll::ReduceOp::kMin);
      AddAlltoall(&cases, n, n % 2 ? DType::kFloat32 : DType::kFloat16);
      // Rows that the ranks divide, and a prime count they do not (2 and 3 ranks).
      AddReducescatter(&cases, 12, n, DType::kFloat32, coll::ReduceOp::kSum);
      AddReducescatter(&cases, 7, n, DType::kFloat64, coll::ReduceOp::kAverage);
    }
  }
  // Every rank submits in its own order: rotated by its rank, reversed on odd ranks.
  std::rotate(cases.begin(), cases.begin() + (g_rank * 5) % cases.size(), cases.end());
  if (g_rank % 2) std::reverse(cases.begin(), cases.end());
  for (int round = 0; round < 2; ++round) {  // the second round uses the numbered announcements
    std::vector<coll::Handle> handles;
    for (auto& c : cases) c.reset();
    for (auto& c : cases) handles.push_back(c.submit());
    for (size_t i = 0; i < cases.size(); ++i) {
      handles[i].Wait();
      cases[i].check(handles[i]);
    }
  }
  Say("exact OK: " + std::to_string(cases.size()) + " collectives x 2 rounds, rank " +
      std::to_string(coll::Rank()) + " of " + std::to_string(coll::Size()) + ", local " +
      std::to_string(coll::LocalRank()) + " of " + std::to_string(coll::LocalSize()));
  return 0;
}

int Fusion() {
  constexpr int kTensors = 100;
  std::vector<Array> arrays;
  for (int t = 0; t < kTensors; ++t) {
    arrays.emplace_back(dtrain::Shape{1000});
    arrays.back().Fill(static_cast<float>(g_rank + t));
  }
  coll::Barrier();
  const auto before = coll::Stats();
  std::vector<coll::Handle> handles;
  for (int t = 0; t < kTensors; ++t) {
    const int k = g_rank % 2 ? kTensors - 1 - t : t;
    handles.push_back(coll::AllreduceAsync("fused." + std::to_string(k), arrays[k], arrays[k],
                                           coll::ReduceOp::kSum));
  }
  for (auto& h : handles) h.Wait();
  const auto after = coll::Stats();
  const int size = coll::Size();
  for (int t = 0; t < kTensors; ++t) {
    const double want = size * (size - 1) / 2.0 + size * t;
    Expect("fused." + std::to_string(t), arrays[t], [&](int64_t) { return want; });
  }
  Say("fusion OK: tensors=" + std::to_string(kTensors) +
      " data_calls=" + std::to_string(after.data_calls - before.data_calls) +
      " fused_tensors=" + std::to_string(after.fused_tensors - before.fused_tensors));
  return 0;
}

int Fp16() {
  const int size = coll::Size();
  const int64_t n = 100000;
  std::vector<Array> arrays;
  std::vector<coll::Handle> handles;
  for (int t = 0; t < 3; ++t) {
    arrays.emplace_back(dtrain::Shape{n});
    auto f = arrays.back().floats();
    for (int64_t i = 0; i < n; ++i) f[i] = 0.001f * static_cast<float>((i % 997) * (g_rank + 1));
    handles.push_back(
        coll::AllreduceAsync("fp16." + std::to_string(t), arrays[t], arrays[t],
                             t == 2 ? coll::ReduceOp::kAverage : coll::ReduceOp::kSum));
  }
  for (auto& h : handles) h.Wait();
  const double ranks_sum = size * (size + 1) / 2.0;
  for (int t = 0; t < 3; ++t) {
    const double scale = t == 2 ? ranks_sum / size : ranks_sum;
    Expect(
        "fp16." + std::to_string(t), arrays[t],
        [&](int64_t i) { return 0.001 * (i % 997) * scale; }, 4e-3);
  }
  Say("fp16 OK");
  return 0;
}

int Die(const Options& o) {
  if (!o.pid_dir.empty()) {
    std::ofstream(o.pid_dir + "/rank" + std::to_string(g_rank) + ".pid") << getpid() << "\n";
  }
  Array a({o.elements});
  for (int64_t step = 0;; ++step) {
    a.Fill(1.0f);
    coll::Allreduce("die.grad", a, a, coll::ReduceOp::kSum);
    if (step % 50 == 0 || o.elements > 100000) Say("step " + std::to_string(step));
  }
}

int Stall(const Options& o) {
  Array a({16});
  a.Fill(1.0f);
  if (g_rank == o.late_rank) std::this_thread::sleep_for(std::chrono::seconds(3));
  coll::Allreduce("stalled.tensor", a, a, coll::ReduceOp::kSum);
  Expect("stalled.tensor", a, [](int64_t) { return coll::Size(); });
  Say("stall OK");
  return 0;
}

int Mismatch() {
  Array a({4 + g_rank});
  try {
    coll::Allreduce("mismatched", a, a, coll::ReduceOp::kSum);
  } catch (const dtrain::InvalidArgument& e) {
    Say(std::string("expected error: ") + e.what());
    // The engine goes on working after a mismatch.
    Array b({8});
    b.Fill(1.0f);
    coll::Allreduce("after.mismatch", b, b, coll::ReduceOp::kSum);
    Expect("after.mismatch", b, [](int64_t) { return coll::Size(); });
    return 3;
  }
  Say("mismatch was not detected");
  return 1;
}

int Timeout(const Options& o) {
  if (g_rank == o.late_rank) {
    // Never submits; leaves once the others have given up.
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return 0;
  }
  Array a({16});
  try {
    coll::Allreduce("never.complete", a, a, coll::ReduceOp::kSum);
  } catch (const dtrain::TimeoutError& e) {
    Say(std::string("expected error: ") + e.what());
    return 3;
  }
  Say("no timeout");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("collectives_check: a checking rank of a collectives job");
  Options o;
  app.add_option("--scenario", o.scenario)
      ->check(CLI::IsMember({"exact", "fusion", "fp16", "die", "stall", "mismatch", "timeout"}));
  app.add_option("--max-elements", o.max_elements);
  app.add_option("--late-rank", o.late_rank);
  app.add_option("--pid-dir", o.pid_dir);
  app.add_option("--elements", o.elements, "die: elements of the allreduced tensor");
  CLI11_PARSE(app, argc, argv);
  try {
    coll::Init();
    g_rank = coll::Rank();
    int code = 0;
    if (o.scenario == "exact") code = Exact(o);
    if (o.scenario == "fusion") code = Fusion();
    if (o.scenario == "fp16") code = Fp16();
    if (o.scenario == "die") code = Die(o);
    if (o.scenario == "stall") code = Stall(o);
    if (o.scenario == "mismatch") code = Mismatch();
    if (o.scenario == "timeout") code = Timeout(o);
    coll::Shutdown();
    return code;
  } catch (const WrongValue& e) {
    Say(std::string("WRONG VALUE: ") + e.what());
    return 1;
  } catch (const dtrain::PeerError& e) {
    Say(std::string("peer error: ") + e.what());
    return 3;
  } catch (const std::exception& e) {
    Say(std::string("error: ") + e.what());
    return 2;
  }
}
