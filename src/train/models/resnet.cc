// "resnet18": ResNet-18 for small images (CIFAR variant: 3x3 stem, stride 1, no max-pool).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train/models/families.h"

namespace dtrain::train {
namespace {

using GateFn = std::function<void(torch::nn::Module&)>;

torch::nn::Conv2d Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  torch::nn::Conv2d conv(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
  // He et al.'s initialisation, as torchvision's ResNet.
  torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
  return conv;
}

// Two 3x3 convolutions with batch norm, plus the input (through a 1x1 convolution and batch norm
// where the stride or the channel count changes). Submodules are registered in the order
// forward() uses them: conv1, bn1, conv2, bn2, then the shortcut's conv and bn.
class BasicBlock : public torch::nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride)
      : conv1_(register_module("conv1", Conv(in, out, 3, stride))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2_(register_module("conv2", Conv(out, out, 3, 1))),
        bn2_(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut_conv_ = register_module("shortcut_conv", Conv(in, out, 1, stride));
      shortcut_bn_ = register_module("shortcut_bn", torch::nn::BatchNorm2d(out));
    }
  }

  torch::Tensor forward(const torch::Tensor& x, const GateFn& gate) {
    gate(*conv1_);
    torch::Tensor y = conv1_(x);
    gate(*bn1_);
    y = torch::relu(bn1_(y));
    gate(*conv2_);
    y = conv2_(y);
    gate(*bn2_);
    y = bn2_(y);
    torch::Tensor shortcut = x;
    if (shortcut_conv_) {
      gate(*shortcut_conv_);
      shortcut = shortcut_conv_(x);
      gate(*shortcut_bn_);
      shortcut = shortcut_bn_(shortcut);
    }
    return torch::relu(y + shortcut);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  torch::nn::Conv2d conv2_;
  torch::nn::BatchNorm2d bn2_;
  torch::nn::Conv2d shortcut_conv_{nullptr};
  torch::nn::BatchNorm2d shortcut_bn_{nullptr};
};

class ResNet18 : public Network {
 public:
  ResNet18(InputShape input, int64_t classes)
      : conv1_(register_module("conv1", Conv(input.channels, 64, 3, 1))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(64))) {
    constexpr int64_t kChannels[] = {64, 128, 256, 512};
    constexpr int64_t kStrides[] = {1, 2, 2, 2};
    int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      // Parameter names as torchvision's: layer1.0.conv1.weight and so on.
      auto layer = register_module("layer" + std::to_string(stage + 1), torch::nn::ModuleList());
      for (int i = 0; i < 2; ++i) {
        auto block =
            std::make_shared<BasicBlock>(in, kChannels[stage], i == 0 ? kStrides[stage] : 1);
        layer->push_back(block);
        blocks_.push_back(block);
        in = kChannels[stage];
      }
    }
    fc_ = register_module("fc", torch::nn::Linear(512, classes));
  }

  torch::Tensor forward(torch::Tensor x) override {
    const GateFn gate = [this](torch::nn::Module& layer) { Gate(layer); };
    Gate(conv1_);
    x = conv1_(x);
    Gate(bn1_);
    x = torch::relu(bn1_(x));
    for (const auto& block : blocks_) x = block->forward(x, gate);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    Gate(fc_);
    return fc_(x);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  std::vector<std::shared_ptr<BasicBlock>> blocks_;  // in forward order; owned by layer1..layer4
  torch::nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<Network> MakeResNet18(InputShape input, int64_t classes) {
  return std::make_shared<ResNet18>(input, classes);
}

}  // namespace dtrain::train
