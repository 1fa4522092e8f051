// The parameter tensors of well-known models, in forward order (input first), for benchmarks that
// emulate a training step: what a worker pushes after each backward pass, tensor by tensor. Only
// trainable parameters (weights, biases, norm scales and shifts), as gradients exist for them.
//
//   lenet      LeNet-5 on 28x28 (this project's LeNet), 61,706 values
//   resnet18   ResNet-18, ImageNet, 11,689,512
//   resnet50   ResNet-50, ImageNet, 25,557,032
//   vgg16      VGG-16, ImageNet, 138,357,544
//   bert-base  BERT-base, uncased vocabulary, 109,482,240
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::bench {

struct ParameterTensor {
  std::string name;
  int64_t elements = 0;
};

// Throws std::invalid_argument naming the known models for any other name.
std::vector<ParameterTensor> ModelParameters(const std::string& model);

std::vector<std::string> KnownModels();

}  // namespace dtrain::bench
