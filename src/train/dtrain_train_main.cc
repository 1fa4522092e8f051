// dtrain-train: data-parallel training of an image classifier, the program a user starts from.
//
//   dtrain launch -n 2 -s 2 --launcher local --
//     dtrain-train --dataset fashion-mnist --network lenet --kvstore dist_sync
//
// Flags follow MXNet's image-classification examples (--kv-store is accepted for --kvstore). It
// prints a progress line with samples/s while an epoch runs and "Epoch N: Test_acc 0.xxxxxx" after
// each epoch.
#include <dlfcn.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "collectives/collectives_internal.h"
#include "common/config/config.h"
#include "common/malloc_tuning.h"
#include "common/usable_cores.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/error.h"
#include "dtrain/kvstore/init.h"
#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/data/dataset.h"
#include "dtrain/train/elastic.h"
#include "dtrain/train/models/network.h"
#include "dtrain/train/trainer.h"
#include "report/reporter.h"
#include "report/timeline.h"

namespace {

using namespace dtrain;
using namespace dtrain::train;

struct Flags {
  std::string dataset = "fashion-mnist";
  std::string data_dir;
  std::string network = "lenet";
  int epochs = 2;
  // Defaults chosen so that the main job (LeNet, Fashion-MNIST, 2 workers) passes 0.88 test
  // accuracy in its 2 epochs: Adam at 0.002 with 16 samples per worker and step.
  int64_t batch_size = 16;
  double lr = 0.002;
  double momentum = 0.9;
  double wd = 0.0;
  std::string optimizer = "adam";
  std::string kvstore;  // "": dist_sync in a job (horovod without servers), local outside one
  std::string devices = "1";
  std::string gpus;  // "0,1": replicas on those CUDA devices (MXNet's --gpus)
  std::vector<double> work_load;
  uint64_t seed = 42;
  int log_interval = 100;
  std::string save;
  std::string resume;
  int threads = 0;
  std::optional<bool> update_on_kvstore;  // unset: DefaultUpdateOnKVStore
  bool no_overlap = false;
  int64_t limit_train = 0;
  std::string lr_scheduler = "none";
  double lr_factor = 0.1;
  double lr_step_epochs = 1;
  int64_t lr_warmup_steps = 0;
  int64_t fuse_below_kb = 64;
  bool fp16_allreduce = false;
  std::string gc_type = "none";
  std::string gc_threshold;  // empty: the type's default
  int64_t gc_min_elements = 4096;
  int64_t commit_every = 50;
};

// LibTorch's intra-op threads and OpenBLAS's threads would otherwise compete for the same cores;
// OpenBLAS runs single-threaded under LibTorch's threads.
int ConfigureThreads(int requested, int workers_on_host, std::string* blas) {
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(1);
    *blas = "OpenBLAS, 1 thread";
  } else {
    *blas = "not OpenBLAS: install libopenblas0-pthread (LeNet 2x, MLP 20x faster)";
  }
  const int cores = UsableCores();  // a pod's CPU limit, not the node's cores
  const int threads = requested > 0 ? requested : std::max(1, cores / std::max(1, workers_on_host));
  torch::set_num_threads(threads);
  static bool interop_set = false;  // settable once a process (an elastic worker comes back here)
  if (!interop_set) torch::set_num_interop_threads(1);
  interop_set = true;
  return threads;
}

int WorkersOnThisHost(const KVStore& kv) {
  // In allreduce mode the collectives know (mpirun's local ranks, or hostnames compared).
  if (kv.type() == "horovod") return collectives::LocalSize();
  const int num_workers = kv.num_workers();
  // `dtrain launch --launcher local` puts every worker on this host.
  const std::string& uri = ProcessConfig().scheduler_host;  // DMLC_PS_ROOT_URI
  const bool local_job = uri.rfind("127.", 0) == 0 || uri == "localhost";
  return local_job ? num_workers : 1;
}

int DeviceCount(const std::string& spec) {
  // "--devices 2" (a count) or "--devices 0,1" (a list).
  if (spec.find(',') != std::string::npos) {
    return static_cast<int>(std::count(spec.begin(), spec.end(), ',')) + 1;
  }
  try {
    int n = std::stoi(spec);
    if (n >= 1 && n <= 64) return n;
  } catch (const std::exception&) {
  }
  throw InvalidArgument("--devices '" + spec + "': give a count (2) or a list (0,1)");
}

// The replicas' devices: --gpus "0,1" (CUDA devices; one id may repeat for several replicas on one
// GPU), else --devices CPU replicas.
std::vector<torch::Device> ReplicaDevices(const Flags& f) {
  if (f.gpus.empty()) return std::vector<torch::Device>(DeviceCount(f.devices), torch::kCPU);
  if (!torch::cuda::is_available()) {
    throw InvalidArgument("--gpus " + f.gpus +
                          ": this dtrain-train's LibTorch sees no CUDA device (a CPU build of "
                          "torch, no GPU, or no driver); use --devices for CPU replicas");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  std::vector<torch::Device> devices;
  // getline drops one empty field at the end: "0," must fail as ",0" does.
  std::stringstream list(f.gpus.back() == ',' ? f.gpus + "," : f.gpus);
  for (std::string id; std::getline(list, id, ',');) {
    size_t used = 0;
    int64_t n = -1;
    try {
      n = std::stoll(id, &used);
    } catch (const std::exception&) {
    }
    if (id.empty() || used != id.size() || n < 0 || n >= count) {
      throw InvalidArgument("--gpus " + f.gpus + ": '" + id + "' is not a CUDA device id (this " +
                            "process sees " + std::to_string(count) + " device(s): 0.." +
                            std::to_string(count - 1) + ")");
    }
    devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(n));
  }
  return devices;
}

double Evaluate(Network& net, const ImageDataset& test, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  net.eval();
  torch::Tensor correct =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  const int64_t chunk = 1000;
  for (int64_t at = 0; at < test.size(); at += chunk) {
    const int64_t n = std::min(chunk, test.size() - at);
    auto logits = net.forward(test.images.narrow(0, at, n).to(device));
    correct += logits.argmax(1).eq(test.labels.narrow(0, at, n).to(device)).sum();
  }
  net.train();
  return static_cast<double>(correct.item<int64_t>()) / static_cast<double>(test.size());
}

// One step over the local replicas (forward, backward, Trainer::Step), the progress line every
// log_interval steps and the epoch's closing lines, as MXNet's fit prints them.
class StepRunner {
 public:
  StepRunner(const Flags& f, const std::vector<std::shared_ptr<Network>>& replicas,
             const std::vector<torch::Device>& on,
             const std::vector<std::pair<int64_t, int64_t>>& parts, const ImageDataset& train)
      : f_(f), replicas_(replicas), on_(on), parts_(parts), train_(train) {}

  void StartEpoch(int64_t epoch, int64_t first_step) {
    epoch_ = epoch;
    epoch_start_ = window_start_ = std::chrono::steady_clock::now();
    ResetWindow(first_step);
  }

  // `idx`: this worker's samples of the step; `step`: its number in the epoch (progress lines).
  void Run(Trainer& trainer, const torch::Tensor& idx, int64_t step, int64_t global_step) {
    auto x = train_.images.index_select(0, idx);
    auto y = train_.labels.index_select(0, idx);
    for (size_t d = 0; d < replicas_.size(); ++d) {
      auto [offset, size] = parts_[d];
      auto xd = x.narrow(0, offset, size).to(on_[d]);
      auto yd = y.narrow(0, offset, size).to(on_[d]);
      const auto step_arg =
          timeline::Enabled()
              ? timeline::Args().Int("step", global_step).Int("device", static_cast<int64_t>(d))
              : timeline::Args();
      torch::Tensor logits, loss;
      {
        timeline::Span span("forward", "train", step_arg);
        logits = replicas_[d]->forward(xd);
        loss = torch::nn::functional::cross_entropy(
            logits, yd, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      }
      {
        timeline::Span span("backward", "train", step_arg);
        loss.backward();
      }
      torch::NoGradGuard no_grad;
      auto correct = logits.argmax(1).eq(yd).sum();
      window_correct_[d] = window_correct_[d].defined() ? window_correct_[d] + correct : correct;
      window_loss_[d] = window_loss_[d].defined() ? window_loss_[d] + loss.detach() : loss.detach();
    }
    trainer.Step(f_.batch_size);
    window_samples_ += f_.batch_size;
    if (f_.log_interval > 0 && (step + 1) % f_.log_interval == 0) PrintProgress(step + 1);
  }

  // After the epoch's `steps` steps and a WaitAll: its time, and the test accuracy.
  void EndEpoch(int64_t steps, const ImageDataset& test) {
    const double epoch_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
    std::printf("Epoch[%lld] Time cost=%.3f (%.1f samples/sec)\n", static_cast<long long>(epoch_),
                epoch_s, static_cast<double>(steps * f_.batch_size) / epoch_s);
    std::printf("Epoch %lld: Test_acc %f\n", static_cast<long long>(epoch_),
                Evaluate(*replicas_[0], test, on_[0]));
    std::fflush(stdout);
  }

 private:
  // Summed where the replicas run, read at each progress line only: reading them every step would
  // make the host wait for each GPU step to finish.
  void PrintProgress(int64_t end) {
    int64_t correct = 0;
    double loss = 0;
    for (size_t d = 0; d < replicas_.size(); ++d) {
      correct += window_correct_[d].item<int64_t>();
      loss += window_loss_[d].item<double>();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
    std::printf(
        "Epoch[%lld] Batch [%lld-%lld] Speed: %.2f samples/sec accuracy=%f cross-entropy=%f\n",
        static_cast<long long>(epoch_), static_cast<long long>(window_first_),
        static_cast<long long>(end), window_samples_ / secs,
        static_cast<double>(correct) / window_samples_, loss / window_samples_);
    std::fflush(stdout);
    window_start_ = std::chrono::steady_clock::now();
    ResetWindow(end);
  }

  void ResetWindow(int64_t first) {
    window_correct_.assign(replicas_.size(), torch::Tensor());
    window_loss_.assign(replicas_.size(), torch::Tensor());
    window_samples_ = 0;
    window_first_ = first;
  }

  const Flags& f_;
  const std::vector<std::shared_ptr<Network>>& replicas_;
  const std::vector<torch::Device>& on_;
  const std::vector<std::pair<int64_t, int64_t>>& parts_;
  const ImageDataset& train_;
  int64_t epoch_ = 0;
  std::chrono::steady_clock::time_point epoch_start_, window_start_;
  std::vector<torch::Tensor> window_correct_, window_loss_;
  int64_t window_samples_ = 0, window_first_ = 0;
};

int Train(const Flags& f, KVStore* kv_ptr);

// The store to use: the one asked for, or, without --kvstore, dist_sync in a job (horovod when it
// has no servers) and local outside one. A store of one process in a job of several workers would
// train that many separate models while the servers wait: refused, saying what to pass.
std::string StoreType(const std::string& asked, const Config& config) {
  const bool in_job = config.role == Role::kWorker;
  if (asked.empty()) {
    if (!in_job) return "local";
    return config.num_servers == 0 ? "horovod" : "dist_sync";
  }
  const bool one_process = asked == "local" || asked == "device";
  if (in_job && one_process && config.num_workers > 1) {
    throw InvalidArgument("--kvstore " + asked + " in a job of " +
                          std::to_string(config.num_workers) +
                          " workers would train separate models: pass --kvstore " +
                          (config.num_servers == 0 ? std::string("horovod") : "dist_sync") +
                          " (or leave --kvstore out)");
  }
  return asked;
}

// --gc-threshold defaults. The Trainer's gradients are sums over the batch (losses with sum
// reduction, as Gluon's), larger than MXNet's 0.5 (2bit) and 0 (1bit) were chosen for. Keys
// under --gc-min-elements (4096) travel uncompressed: LeNet's conv1 and biases, whose gradients
// are 100x fc1's, saturate any threshold that suits the big layers. See docs/performance.md
// ("Accuracy") for the sweep and the runs over several seeds.
const std::map<std::string, std::string> kDefaultGcThresholds = {{"2bit", "3"}, {"1bit", "1"}};

int TrainElastic(const Flags& f);

// Runs `train`; a dtrain or LibTorch error it throws is printed and reported to the launcher, and
// gives exit code 1.
template <typename Train>
int ReportingErrors(Train&& train) {
  try {
    return train();
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain-train: error: %s\n", e.what());
    report::Send({{"kind", "error"}, {"message", e.what()}});
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dtrain-train: error: %s\n", e.what_without_backtrace());
    report::Send({{"kind", "error"}, {"message", e.what_without_backtrace()}});
  }
  std::fflush(stderr);
  return 1;
}

// Errors are printed while the kvstore still lives: leaving the job first would let the launcher
// stop this process (the job failed) before it says why.
int Run(const Flags& f) {
  // Read by the collectives when the horovod kvstore starts them.
  if (f.fp16_allreduce) ::setenv("DTRAIN_FP16_ALLREDUCE", "1", 1);
  const std::string store = StoreType(f.kvstore, Config::FromEnvironment());
  if (collectives::IsElastic()) {
    if (store != "horovod") {
      throw InvalidArgument("--kvstore " + store + " in an elastic job (dtrain launch " +
                            "--host-discovery-script): elastic jobs are allreduce jobs; pass " +
                            "--kvstore horovod (or leave --kvstore out)");
    }
    return ReportingErrors([&] { return TrainElastic(f); });
  }
  auto kv = KVStore::Create(store);
  return ReportingErrors([&] {
    if (f.gc_type != "none") {
      std::map<std::string, std::string> gc{{"type", f.gc_type}};
      if (!f.gc_threshold.empty()) {
        gc["threshold"] = f.gc_threshold;
      } else if (auto it = kDefaultGcThresholds.find(f.gc_type); it != kDefaultGcThresholds.end()) {
        gc["threshold"] = it->second;
      }
      gc["min_elements"] = std::to_string(f.gc_min_elements);
      kv->SetGradientCompression(gc);
    }
    return Train(f, kv.get());
  });
}

// What the training loops work on: the data, the replicas on their devices, how a batch is split
// over them, and the Trainer's options. `workers`: the job's, for the schedules' epoch lengths.
struct Setup {
  ImageDataset train, test;
  std::vector<torch::Device> on;
  std::vector<std::shared_ptr<Network>> replicas;
  std::vector<std::pair<int64_t, int64_t>> parts;
  TrainerOptions options;
};

Setup Prepare(const Flags& f, const std::string& store_type, int workers) {
  Setup s;
  if (!f.gpus.empty() && f.devices != "1") {
    throw InvalidArgument("--gpus " + f.gpus + " and --devices " + f.devices +
                          ": give one (GPUs, or CPU replicas)");
  }
  s.on = ReplicaDevices(f);
  const int devices = static_cast<int>(s.on.size());
  if (f.batch_size < devices) {
    throw InvalidArgument("--batch-size " + std::to_string(f.batch_size) + " is smaller than the " +
                          std::to_string(devices) + " devices it is split over");
  }
  const std::string dir = f.data_dir.empty() ? DefaultDataDir(f.dataset) : f.data_dir;
  s.train = LoadDataset(f.dataset, dir, Split::kTrain, f.seed);
  s.test = LoadDataset(f.dataset, dir, Split::kTest, f.seed);
  if (f.limit_train > 0 && f.limit_train < s.train.size()) {
    s.train.images = s.train.images.narrow(0, 0, f.limit_train);
    s.train.labels = s.train.labels.narrow(0, 0, f.limit_train);
  }
  const InputShape shape{s.train.images.size(1), s.train.images.size(2), s.train.images.size(3)};

  torch::manual_seed(f.seed);
  for (int d = 0; d < devices; ++d) {
    s.replicas.push_back(MakeNetwork(f.network, shape, s.train.num_classes));
    s.replicas.back()->to(s.on[d]);
  }
  s.parts = SplitBatch(f.batch_size, devices, f.work_load);

  TrainerOptions& options = s.options;
  options.optimizer.name = f.optimizer;
  options.optimizer.params = {{"learning_rate", f.lr}};
  if (f.optimizer == "sgd" || f.optimizer == "nag")
    options.optimizer.params["momentum"] = f.momentum;
  if (f.wd > 0) options.optimizer.params["wd"] = f.wd;
  options.batch_size = f.batch_size;
  // Schedules count optimizer updates; the flags speak in epochs.
  const int64_t steps_per_epoch = s.train.size() / workers / f.batch_size;
  if (f.lr_scheduler == "step") {
    options.optimizer.lr_scheduler = "step";
    options.optimizer.params["lr_step"] =
        std::max<double>(1, std::round(f.lr_step_epochs * steps_per_epoch));
    options.optimizer.params["lr_factor"] = f.lr_factor;
  } else if (f.lr_scheduler == "cosine") {
    options.optimizer.lr_scheduler = "cosine";
    options.optimizer.params["lr_max_update"] =
        static_cast<double>(std::max<int64_t>(1, steps_per_epoch * std::max(1, f.epochs)));
  }
  if (f.lr_warmup_steps > 0 && f.lr_scheduler != "none") {
    options.optimizer.params["lr_warmup_steps"] = static_cast<double>(f.lr_warmup_steps);
  }
  options.update_on_kvstore =
      f.update_on_kvstore.value_or(DefaultUpdateOnKVStore(store_type, !f.gpus.empty()));
  options.fuse_below_bytes = f.fuse_below_kb * 1024;
  options.overlap = !f.no_overlap;
  if (!f.resume.empty()) {
    // Load before the trainer starts: rank 0's (loaded) weights then become everyone's.
    torch::serialize::InputArchive archive;
    archive.load_from(f.resume);
    LoadInto(archive, *s.replicas[0]);
  }
  return s;
}

int Train(const Flags& f, KVStore* kv_ptr) {
  KVStore* kv = kv_ptr;
  const int rank = kv->rank();
  const int workers = kv->num_workers();
  std::string blas;
  const int threads = ConfigureThreads(f.threads, WorkersOnThisHost(*kv), &blas);
  Setup setup = Prepare(f, kv->type(), workers);
  const auto& [train, test, on, replicas, parts, options] = setup;
  const int devices = static_cast<int>(on.size());
  Trainer trainer(replicas, *kv, options);
  // A replacement for a lost worker (dtrain launch --max-restarts) finds the optimizer's state on
  // the servers, and resumes at the step its rank had reached.
  if (!f.resume.empty() && !kv->rejoined()) trainer.LoadOptimizerState(f.resume);
  const int64_t resume_at = kv->rounds_done();

  const SplitSampler sampler(train.size(), workers, rank, f.seed);
  const int64_t steps = sampler.size() / f.batch_size;
  if (steps < 1) {
    throw InvalidArgument("worker " + std::to_string(rank) + " has " +
                          std::to_string(sampler.size()) + " samples, fewer than one batch of " +
                          std::to_string(f.batch_size));
  }
  std::printf(
      "worker %d of %d: %s on %s, %lld samples, %lld steps/epoch, batch %lld over %d device(s) "
      "(%s), kvstore %s, %d LibTorch thread(s), BLAS: %s\n",
      rank, workers, f.network.c_str(), f.dataset.c_str(), static_cast<long long>(sampler.size()),
      static_cast<long long>(steps), static_cast<long long>(f.batch_size), devices,
      f.gpus.empty() ? "CPU" : ("GPU " + f.gpus).c_str(), kv->type().c_str(), threads,
      blas.c_str());
  std::fflush(stdout);

  if (kv->rejoined()) {
    std::printf(
        "worker %d replaces a lost worker: resuming at step %lld (epoch %lld, batch %lld)\n", rank,
        static_cast<long long>(resume_at), static_cast<long long>(resume_at / steps),
        static_cast<long long>(resume_at % steps));
    std::fflush(stdout);
  }

  StepRunner runner(f, replicas, on, parts, train);
  int64_t global_step = 0;  // the timeline's step numbers, as the trainer counts them
  for (int epoch = 0; epoch < f.epochs; ++epoch) {
    if (global_step + steps <= resume_at) {  // done before this process joined
      global_step += steps;
      continue;
    }
    const auto indices = torch::tensor(sampler.EpochIndices(epoch), torch::kInt64);
    const int64_t first_step = std::max<int64_t>(0, resume_at - global_step);
    global_step += first_step;
    runner.StartEpoch(epoch, first_step);
    for (int64_t step = first_step; step < steps; ++step) {
      runner.Run(trainer, indices.narrow(0, step * f.batch_size, f.batch_size), step, global_step);
      ++global_step;
    }
    trainer.WaitAll();
    if (epoch + 1 == f.epochs && kv->type().find("async") != std::string::npos) {
      // Each dist_async worker's copy lags the others' last pushes: the model tested and saved
      // is the job's, once every worker has pushed its last step.
      kv->Barrier();
      trainer.PullLatest();
      std::printf("worker %d: the job's final weights, after every worker's last push\n", rank);
      std::fflush(stdout);
    }
    runner.EndEpoch(steps - first_step, test);
  }
  if (!f.save.empty() && rank == 0) {
    trainer.Save(f.save);
    std::printf("saved the model to %s\n", f.save.c_str());
  }
  return 0;
}

// An elastic job (dtrain launch -s 0 --host-discovery-script): Horovod's elastic loop through
// train::RunElastic. The epoch's samples are taken in one order every rank knows, a global batch
// (batch x ranks) per step, rank r taking its r-th slice, so the position (ElasticState's
// samples_done) is the job's and carries over to a membership of another size.
int TrainElastic(const Flags& f) {
  try {
    Setup setup = Prepare(f, "horovod", std::max(1, Config::FromEnvironment().num_workers));
    const auto& [train, test, on, replicas, parts, options] = setup;
    const SplitSampler whole(train.size(), 1, 0, f.seed);  // the epoch's order, the same everywhere
    StepRunner runner(f, replicas, on, parts, train);
    ElasticState state(replicas);
    RunElastic(
        state, [&](KVStore& kv) { return std::make_unique<Trainer>(replicas, kv, options); },
        [&](Trainer& trainer, KVStore& kv, ElasticState& state) {
          const int rank = kv.rank();
          const int size = kv.num_workers();
          std::string blas;
          const int threads = ConfigureThreads(f.threads, collectives::LocalSize(), &blas);
          const int64_t global_batch = f.batch_size * size;
          if (train.size() < global_batch) {
            throw InvalidArgument(std::to_string(train.size()) + " samples are fewer than one " +
                                  "global batch of " + std::to_string(global_batch));
          }
          std::printf(
              "worker %d of %d (elastic, pid %d): %s on %s, batch %lld a rank, %d LibTorch "
              "thread(s), BLAS: %s; from epoch %lld, sample %lld of %lld, step %lld\n",
              rank, size, static_cast<int>(::getpid()), f.network.c_str(), f.dataset.c_str(),
              static_cast<long long>(f.batch_size), threads, blas.c_str(),
              static_cast<long long>(state.epoch), static_cast<long long>(state.samples_done),
              static_cast<long long>(train.size()), static_cast<long long>(state.steps));
          std::fflush(stdout);
          while (state.epoch < f.epochs) {
            const auto order =
                torch::tensor(whole.EpochIndices(static_cast<int>(state.epoch)), torch::kInt64);
            const int64_t first = state.samples_done;
            runner.StartEpoch(state.epoch, state.samples_done / global_batch);
            while (state.samples_done + global_batch <= train.size()) {
              const auto idx =
                  order.narrow(0, state.samples_done + rank * f.batch_size, f.batch_size);
              runner.Run(trainer, idx, state.samples_done / global_batch, state.steps);
              state.samples_done += global_batch;
              ++state.steps;
              if (state.steps % f.commit_every == 0) state.Commit();
            }
            trainer.WaitAll();
            runner.EndEpoch((state.samples_done - first) / global_batch, test);
            ++state.epoch;
            state.samples_done = 0;
            state.Commit();
          }
          if (!f.save.empty() && rank == 0) {
            trainer.Save(f.save);
            std::printf("saved the model to %s\n", f.save.c_str());
          }
          // Equal on every rank when their weights are: what tests and users compare.
          double sum = 0;
          for (const auto& p : replicas[0]->parameters(true)) sum += p.sum().item<double>();
          std::printf("worker %d of %d: trained %lld step(s); sum of the weights %.10g\n", rank,
                      size, static_cast<long long>(state.steps), sum);
          std::fflush(stdout);
        });
    return 0;
  } catch (const collectives::RemovedFromJob& e) {
    std::fprintf(stderr, "dtrain-train: %s; exiting\n", e.what());
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-train: data-parallel training of an image classifier"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  Flags f;
  app.add_option("--dataset", f.dataset)
      ->check(CLI::IsMember({"fashion-mnist", "mnist", "cifar10", "synthetic"}));
  app.add_option("--data-dir", f.data_dir, "default: where the data set's package puts it");
  app.add_option("--network", f.network, "mlp, lenet, resnet18, vgg11");
  app.add_option("--epochs,--num-epochs", f.epochs)->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", f.batch_size, "per worker")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr)->check(CLI::PositiveNumber);
  app.add_option("--momentum", f.momentum);
  app.add_option("--wd", f.wd);
  app.add_option("--optimizer", f.optimizer, "sgd, nag, adam, adagrad, rmsprop");
  app.add_option("--kvstore,--kv-store", f.kvstore,
                 "local, device, dist_sync, dist_async, ..., horovod (allreduce among workers); "
                 "default: dist_sync in a job (horovod without servers), local outside one");
  app.add_flag("--fp16-allreduce", f.fp16_allreduce,
               "horovod: send gradients as float16 (half the bytes, ~3 digits)");
  app.add_option("--gc-type", f.gc_type,
                 "gradient compression of pushes: none, 2bit, 1bit (error feedback), fp16")
      ->check(CLI::IsMember({"none", "2bit", "1bit", "fp16"}));
  app.add_option("--gc-threshold", f.gc_threshold,
                 "gradient compression threshold (default: 3 for 2bit, 1 for 1bit)");
  app.add_option("--gc-min-elements", f.gc_min_elements,
                 "parameters with fewer elements travel uncompressed (0: compress all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gpus", f.gpus,
                 "replicas on these CUDA devices, e.g. 0,1 (an id may repeat: several replicas "
                 "on one GPU)");
  app.add_option("--devices", f.devices, "replicas on the CPU: a count, or a list (0,1)");
  app.add_option("--work-load-list", f.work_load, "relative share of each device")->delimiter(',');
  app.add_option("--seed", f.seed);
  app.add_option("--log-interval,--disp-batches", f.log_interval,
                 "batches between progress lines (0: none)");
  app.add_option("--save", f.save, "save the model here after training (rank 0)");
  app.add_option("--resume", f.resume, "start from a model saved with --save");
  app.add_option("--threads", f.threads,
                 "LibTorch threads (default: cores / workers on this host)");
  app.add_option("--update-on-kvstore", f.update_on_kvstore,
                 "run the optimizer in the kvstore (default: yes, but on the GPU in this process "
                 "for a local store with --gpus)");
  app.add_flag("--no-overlap", f.no_overlap, "push gradients at step() instead of during backward");
  app.add_option("--limit-train", f.limit_train, "use only the first N training samples");
  app.add_option("--lr-scheduler", f.lr_scheduler,
                 "none, step (x lr-factor every lr-step-epochs), cosine (to 0 at the end)")
      ->check(CLI::IsMember({"none", "step", "cosine"}));
  app.add_option("--fuse-below-kb", f.fuse_below_kb,
                 "parameters smaller than this travel fused in one key (0: one key each)");
  app.add_option("--lr-factor", f.lr_factor, "step schedule: multiply the rate by this");
  app.add_option("--lr-step-epochs", f.lr_step_epochs, "step schedule: epochs between steps");
  app.add_option("--commit-every", f.commit_every,
                 "elastic jobs (dtrain launch --host-discovery-script): steps between commits, "
                 "the point a failure rolls back to")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr-warmup-steps", f.lr_warmup_steps, "linear warm-up over this many updates");
  CLI11_PARSE(app, argc, argv);  // before serving: `DMLC_ROLE=server dtrain-train --help` helps
  try {
    dtrain::Initialize();  // with DMLC_ROLE=server/scheduler this process serves and exits here
    dtrain::KeepFreedMemoryAsConfigured();  // a worker: its heap keeps each step's memory
    return Run(f);
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain-train: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dtrain-train: error: %s\n", e.what_without_backtrace());
    return 1;
  }
}
