// "mlp": the 784-512-512-10 benchmark network, generalised to any image shape and class count.
#include <memory>

#include "train/models/families.h"

namespace dtrain::train {
namespace {

class Mlp : public Network {
 public:
  Mlp(InputShape input, int64_t classes)
      : fc1_(register_module(
            "fc1", torch::nn::Linear(input.channels * input.height * input.width, kHidden))),
        fc2_(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        fc3_(register_module("fc3", torch::nn::Linear(kHidden, classes))) {}

  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(1);
    Gate(fc1_);
    x = torch::relu(fc1_(x));
    Gate(fc2_);
    x = torch::relu(fc2_(x));
    Gate(fc3_);
    return fc3_(x);
  }

 private:
  static constexpr int64_t kHidden = 512;

  torch::nn::Linear fc1_;
  torch::nn::Linear fc2_;
  torch::nn::Linear fc3_;
};

}  // namespace

std::shared_ptr<Network> MakeMlp(InputShape input, int64_t classes) {
  return std::make_shared<Mlp>(input, classes);
}

}  // namespace dtrain::train
