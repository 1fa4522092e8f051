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

  // Called with each submodule just before forward() uses its parameters. The gated submodules
  // own every parameter of the network between them, each parameter under exactly one of them,
  // and are gated in the order of named_parameters(). forward() calls the gate on the calling
  // thread; set it only while no forward() runs.
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

// Networks by name, built for images of shape `input` and `classes` outputs:
//   "mlp"      flatten, Linear(C*H*W, 512), ReLU, Linear(512, 512), ReLU, Linear(512, classes)
//              (the 784-512-512-10 benchmark network for MNIST-shaped input).
//   "lenet"    LeNet-5 with ReLU: Conv(C, 6, 5x5, padding 2 when the image is smaller than
//              32x32, as for 28x28 MNIST) ReLU MaxPool(2), Conv(6, 16, 5x5) ReLU MaxPool(2),
//              flatten, Linear(16*h*w, 120) ReLU, Linear(120, 84) ReLU, Linear(84, classes);
//              16*h*w is 16*5*5 for 1x28x28 and 3x32x32 input.
//   "resnet18" CIFAR ResNet-18: 3x3 stem conv to 64 channels (stride 1, no max-pool), BN, ReLU;
//              four stages of two BasicBlocks (64/128/256/512 channels, strides 1/2/2/2; a 1x1
//              conv + BN shortcut where the shape changes); global average pool,
//              Linear(512, classes). Convolutions have no bias (batch norm follows).
//   "vgg11"    VGG-11 with batch norm: [64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M],
//              each number a 3x3 conv (padding 1, with bias) + BN + ReLU, M a 2x2 max-pool with
//              ceil_mode (so 28x28 input ends at 1x1 like 32x32 does); global average pool,
//              Linear(512, classes).
// Parameters are registered in the order forward() uses them, so named_parameters() lists them
// in forward order under names that are the same in every process. Initialisation draws only
// from torch's global generator: torch::manual_seed before MakeNetwork makes it reproducible.
// Linear layers, and the convolutions of "lenet", keep LibTorch's default initialisation; the
// convolutions of "resnet18" and "vgg11" are He-normal (fan out, as torchvision), with zero bias
// in "vgg11"; batch norm starts at scale 1, shift 0.
// Throws dtrain::InvalidArgument for an unknown name (listing the known ones), a non-positive
// shape or class count, or an image too small for the network.
std::shared_ptr<Network> MakeNetwork(const std::string& name, InputShape input, int64_t classes);
std::vector<std::string> NetworkNames();

}  // namespace dtrain::train
