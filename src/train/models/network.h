// Networks by name: the models dtrain-train trains.
//
// Every network maps a batch of images (N, C, H, W) float32 to logits (N, classes). Before using a
// layer's weights, forward() calls Gate(layer): the Trainer installs a gate that waits only for
// that layer's pending weight update, so the next forward starts as soon as its first layer's
// weights are back while later layers are still being synchronised.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::train {

struct InputShape {
  int64_t channels = 1;
  int64_t height = 28;
  int64_t width = 28;
};

class Network : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;

  // Called with each submodule just before forward() uses its parameters.
  void set_gate(std::function<void(torch::nn::Module&)> gate) { gate_ = std::move(gate); }

 protected:
  void Gate(torch::nn::Module& layer) {
    if (gate_) gate_(layer);
  }
  template <typename Holder>
  void Gate(Holder& holder) {
    if (gate_) gate_(*holder);
  }

 private:
  std::function<void(torch::nn::Module&)> gate_;
};

// "mlp" (784-512-512-10 style: flatten, two hidden layers of 512 with ReLU), "lenet" (LeNet-5:
// two conv layers, three fully connected), "resnet18" (CIFAR variant: 3x3 stem, no max-pool),
// "vgg11" (with batch norm). Throws dtrain::InvalidArgument for an unknown name, listing the
// known ones.
std::shared_ptr<Network> MakeNetwork(const std::string& name, InputShape input, int64_t classes);
std::vector<std::string> NetworkNames();

}  // namespace dtrain::train
