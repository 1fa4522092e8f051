// Distributed softmax regression on synthetic data with a dist KVStore.
//
// The smallest real training program: each worker reads its own 1/num_workers of the training
// set (as MXNet's SplitSampler does), computes gradients of a linear softmax classifier, pushes
// them, and pulls the weights that the servers' SGD produced. It prints "Epoch N: Test_acc X"
// after each epoch, as the MXNet examples do.
//
//   dtrain launch -n 2 -s 2 --launcher local -- dtrain-example-softmax --epochs 5
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/kvstore/init.h"
#include "dtrain/kvstore/kvstore.h"

namespace {

constexpr int kClasses = 10;
constexpr int kFeatures = 32;

struct Dataset {
  std::vector<float> x;  // samples x kFeatures
  std::vector<int> y;
  int size() const { return static_cast<int>(y.size()); }
};

// Gaussian clusters around fixed class centres: the same data on every worker (same seed).
Dataset MakeData(int samples, uint32_t seed, const std::vector<float>& centres) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.6f);
  std::uniform_int_distribution<int> label(0, kClasses - 1);
  Dataset d;
  d.x.resize(static_cast<size_t>(samples) * kFeatures);
  d.y.resize(samples);
  for (int i = 0; i < samples; ++i) {
    d.y[i] = label(rng);
    for (int f = 0; f < kFeatures; ++f) {
      d.x[i * kFeatures + f] = centres[d.y[i] * kFeatures + f] + noise(rng);
    }
  }
  return d;
}

// Logits of sample i; returns the predicted class.
int Forward(const float* w, const float* b, const float* x, float* logits) {
  int best = 0;
  for (int c = 0; c < kClasses; ++c) {
    float z = b[c];
    for (int f = 0; f < kFeatures; ++f) z += w[c * kFeatures + f] * x[f];
    logits[c] = z;
    if (z > logits[best]) best = c;
  }
  return best;
}

double Accuracy(const dtrain::Array& w, const dtrain::Array& b, const Dataset& d) {
  int correct = 0;
  float logits[kClasses];
  for (int i = 0; i < d.size(); ++i) {
    correct += Forward(w.floats().data(), b.floats().data(), &d.x[i * kFeatures], logits) == d.y[i];
  }
  return static_cast<double>(correct) / d.size();
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::Initialize();  // servers and the scheduler run here and exit when the job ends
  CLI::App app{"dtrain example: distributed softmax regression on synthetic data"};
  std::string kvstore = "dist_sync";
  int epochs = 5;
  int batch = 64;
  double lr = 0.1;
  int train_size = 60000;
  app.add_option("--kvstore", kvstore, "local, dist_sync, dist_async, ...");
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "per worker")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr)->check(CLI::PositiveNumber);
  app.add_option("--train-size", train_size)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    auto kv = dtrain::KVStore::Create(kvstore);
    const int rank = kv->rank();
    const int workers = kv->num_workers();
    std::mt19937 centre_rng(7);
    std::normal_distribution<float> centre(0.0f, 1.0f);
    std::vector<float> centres(kClasses * kFeatures);
    for (float& c : centres) c = centre(centre_rng);
    const Dataset train = MakeData(train_size, 1, centres);
    const Dataset test = MakeData(10000, 2, centres);

    dtrain::Array w({kClasses, kFeatures});
    dtrain::Array b({kClasses});
    kv->Init(0, w);
    kv->Init(1, b);
    // The servers apply SGD to the sum of all workers' gradients, rescaled to a mean.
    kv->SetOptimizer(
        {"sgd",
         {{"learning_rate", lr}, {"momentum", 0.9}, {"rescale_grad", 1.0 / (batch * workers)}}});

    // This worker's part of the training set, shuffled each epoch.
    const int part = train.size() / workers;
    std::vector<int> order(part);
    std::iota(order.begin(), order.end(), rank * part);
    std::mt19937 shuffle_rng(100 + rank);
    dtrain::Array gw({kClasses, kFeatures});
    dtrain::Array gb({kClasses});
    const int steps = part / batch;  // the same on every worker, as dist_sync needs
    for (int epoch = 0; epoch < epochs; ++epoch) {
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      const auto start = std::chrono::steady_clock::now();
      for (int step = 0; step < steps; ++step) {
        kv->Pull(0, {w});
        kv->Pull(1, {b}).Wait();
        kv->WaitAll();
        gw.Fill(0.0f);
        gb.Fill(0.0f);
        float logits[kClasses];
        for (int k = 0; k < batch; ++k) {
          const int i = order[step * batch + k];
          const float* x = &train.x[i * kFeatures];
          Forward(w.floats().data(), b.floats().data(), x, logits);
          float max = *std::max_element(logits, logits + kClasses), sum = 0;
          for (float& z : logits) sum += (z = std::exp(z - max));
          for (int c = 0; c < kClasses; ++c) {
            const float g = logits[c] / sum - (c == train.y[i] ? 1.0f : 0.0f);
            gb.floats()[c] += g;
            for (int f = 0; f < kFeatures; ++f) gw.floats()[c * kFeatures + f] += g * x[f];
          }
        }
        kv->Push(0, {gw});
        kv->Push(1, {gb});
        kv->WaitAll();
      }
      kv->Pull(0, {w});
      kv->Pull(1, {b});
      kv->WaitAll();
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("Epoch %d: %d samples/s on worker %d\n", epoch,
                  static_cast<int>(steps * batch / secs), rank);
      std::printf("Epoch %d: Test_acc %f\n", epoch, Accuracy(w, b, test));
      std::fflush(stdout);
    }
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain-example-softmax: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
