// "vgg11": VGG-11 with batch norm, CIFAR style (one Linear classifier on 512 features).
#include <memory>
#include <string>
#include <vector>

#include "train/models/families.h"

namespace dtrain::train {
namespace {

constexpr int64_t kMaxPool = 0;
// Configuration "A" of Simonyan and Zisserman: output channels of each 3x3 conv, kMaxPool for a
// 2x2 max-pool.
constexpr int64_t kConfig[] = {64,  kMaxPool, 128,      kMaxPool, 256, 256,     kMaxPool,
                               512, 512,      kMaxPool, 512,      512, kMaxPool};

class Vgg11 : public Network {
 public:
  Vgg11(InputShape input, int64_t classes) {
    int64_t in = input.channels;
    for (int64_t out : kConfig) {
      if (out == kMaxPool) continue;
      const std::string index = std::to_string(convs_.size() + 1);
      torch::nn::Conv2d conv(torch::nn::Conv2dOptions(in, out, 3).padding(1));
      // As torchvision's VGG: He et al.'s initialisation, zero bias.
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      torch::nn::init::zeros_(conv->bias);
      convs_.push_back(register_module("conv" + index, conv));
      bns_.push_back(register_module("bn" + index, torch::nn::BatchNorm2d(out)));
      in = out;
    }
    fc_ = register_module("fc", torch::nn::Linear(in, classes));
  }

  torch::Tensor forward(torch::Tensor x) override {
    size_t layer = 0;
    for (int64_t out : kConfig) {
      if (out == kMaxPool) {
        // ceil_mode: 28 -> 14 -> 7 -> 4 -> 2 -> 1, where floor would reach 0; no change for 32.
        x = torch::max_pool2d(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, /*ceil_mode=*/true);
        continue;
      }
      Gate(convs_[layer]);
      x = convs_[layer](x);
      Gate(bns_[layer]);
      x = torch::relu(bns_[layer](x));
      ++layer;
    }
    // 1x1 already for 28x28 and 32x32 input; averages what is left for larger images.
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    Gate(fc_);
    return fc_(x);
  }

 private:
  std::vector<torch::nn::Conv2d> convs_;
  std::vector<torch::nn::BatchNorm2d> bns_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<Network> MakeVgg11(InputShape input, int64_t classes) {
  return std::make_shared<Vgg11>(input, classes);
}

}  // namespace dtrain::train
