// "lenet": LeNet-5 with ReLU and max-pooling, as in the common PyTorch and Gluon examples.
#include <memory>
#include <string>

#include "dtrain/common/error.h"
#include "train/models/families.h"

namespace dtrain::train {
namespace {

// LeNet-5 was designed for 32x32 images; MNIST's 28x28 digits were padded to that size. Padding
// the first convolution by 2 does the same for any image smaller than 32x32.
int64_t FirstPadding(InputShape input) { return input.height < 32 || input.width < 32 ? 2 : 0; }

// Side of the feature map after conv 5x5 (padding `padding`), pool 2, conv 5x5, pool 2.
int64_t FeatureSide(int64_t side, int64_t padding) {
  side = (side + 2 * padding - 4) / 2;
  return (side - 4) / 2;
}

class LeNet : public Network {
 public:
  LeNet(InputShape input, int64_t classes, int64_t feature_height, int64_t feature_width)
      : conv1_(register_module(
            "conv1",
            torch::nn::Conv2d(
                torch::nn::Conv2dOptions(input.channels, 6, 5).padding(FirstPadding(input))))),
        conv2_(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)))),
        fc1_(register_module("fc1", torch::nn::Linear(16 * feature_height * feature_width, 120))),
        fc2_(register_module("fc2", torch::nn::Linear(120, 84))),
        fc3_(register_module("fc3", torch::nn::Linear(84, classes))) {}

  torch::Tensor forward(torch::Tensor x) override {
    Gate(conv1_);
    x = torch::max_pool2d(torch::relu(conv1_(x)), 2);
    Gate(conv2_);
    x = torch::max_pool2d(torch::relu(conv2_(x)), 2);
    x = x.flatten(1);
    Gate(fc1_);
    x = torch::relu(fc1_(x));
    Gate(fc2_);
    x = torch::relu(fc2_(x));
    Gate(fc3_);
    return fc3_(x);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::Conv2d conv2_;
  torch::nn::Linear fc1_;
  torch::nn::Linear fc2_;
  torch::nn::Linear fc3_;
};

}  // namespace

std::shared_ptr<Network> MakeLeNet(InputShape input, int64_t classes) {
  const int64_t padding = FirstPadding(input);
  const int64_t feature_height = FeatureSide(input.height, padding);
  const int64_t feature_width = FeatureSide(input.width, padding);
  if (feature_height < 1 || feature_width < 1) {
    throw InvalidArgument("network 'lenet': a " + std::to_string(input.height) + "x" +
                          std::to_string(input.width) +
                          " image is too small (LeNet-5 needs at least 12x12)");
  }
  return std::make_shared<LeNet>(input, classes, feature_height, feature_width);
}

}  // namespace dtrain::train
