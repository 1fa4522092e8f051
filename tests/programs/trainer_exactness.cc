// Trains a fixed network for a few SGD steps on fixed data and writes the final parameters, so that
// tests can compare layouts: one worker with the whole global batch against N workers each given
// its slice of every global batch, several local devices, and update_on_kvstore on or off.
//
//   trainer_exactness --kvstore local --global-batch 16 --out a.bin
//   dtrain launch -n 2 -s 2 -- trainer_exactness --kvstore dist_sync --global-batch 16 --out b.bin
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "dtrain/common/error.h"
#include "dtrain/kvstore/init.h"
#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/models/network.h"
#include "dtrain/train/trainer.h"

int main(int argc, char** argv) {
  dtrain::Initialize();
  CLI::App app{"trainer exactness check"};
  std::string kvstore = "local", network = "lenet", out, optimizer = "sgd";
  int64_t global_batch = 16;
  int steps = 5, devices = 1;
  bool update_on_kvstore = true, overlap = true;
  int64_t fuse_below_kb = 64;
  app.add_option("--kvstore", kvstore);
  app.add_option("--network", network);
  app.add_option("--optimizer", optimizer);
  app.add_option("--global-batch", global_batch);
  app.add_option("--steps", steps);
  app.add_option("--devices", devices);
  app.add_option("--update-on-kvstore", update_on_kvstore);
  app.add_option("--overlap", overlap);
  app.add_option("--fuse-below-kb", fuse_below_kb);
  app.add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    auto kv = dtrain::KVStore::Create(kvstore);
    const int workers = kv->num_workers();
    const int rank = kv->rank();
    const int64_t batch = global_batch / workers;  // this worker's slice of every global batch
    torch::manual_seed(1234 + rank);  // different on purpose: rank 0's weights must win
    std::vector<std::shared_ptr<dtrain::train::Network>> replicas;
    for (int d = 0; d < devices; ++d) {
      replicas.push_back(dtrain::train::MakeNetwork(network, {1, 28, 28}, 10));
    }
    dtrain::train::TrainerOptions options;
    options.optimizer = {optimizer, {{"learning_rate", 0.05}}};
    if (optimizer == "sgd") options.optimizer.params["momentum"] = 0.9;
    options.optimizer.params["wd"] = 1e-4;
    options.batch_size = batch;
    options.update_on_kvstore = update_on_kvstore;
    options.overlap = overlap;
    options.fuse_below_bytes = fuse_below_kb * 1024;
    dtrain::train::Trainer trainer(replicas, *kv, options);

    torch::manual_seed(99);  // the same data everywhere
    auto images = torch::randn({steps, global_batch, 1, 28, 28});
    auto labels = torch::randint(0, 10, {steps, global_batch}, torch::kInt64);
    for (int s = 0; s < steps; ++s) {
      auto x = images[s].narrow(0, rank * batch, batch);
      auto y = labels[s].narrow(0, rank * batch, batch);
      const int64_t per_device = batch / devices;
      for (int d = 0; d < devices; ++d) {
        const int64_t n = d + 1 == devices ? batch - per_device * d : per_device;
        auto logits = replicas[d]->forward(x.narrow(0, d * per_device, n));
        auto loss = torch::nn::functional::cross_entropy(
            logits, y.narrow(0, d * per_device, n),
            torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
        loss.backward();
      }
      trainer.Step(batch);
    }
    trainer.WaitAll();
    if (rank == 0) {
      std::ofstream file(out, std::ios::binary);
      for (const auto& p : replicas[0]->parameters()) {
        auto c = p.contiguous();
        file.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
      }
    }
    // Every replica must hold the same weights.
    for (size_t d = 1; d < replicas.size(); ++d) {
      auto a = replicas[0]->parameters(), b = replicas[d]->parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        if (!torch::equal(a[i], b[i])) {
          std::fprintf(stderr, "replica %zu differs from replica 0\n", d);
          return 2;
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_exactness: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
