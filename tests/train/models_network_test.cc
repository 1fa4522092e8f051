// Networks by name: shapes, parameter counts, gates, initialisation, gradients.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/train/models/network.h"

namespace dtrain::train {
namespace {

constexpr InputShape kMnist{1, 28, 28};
constexpr InputShape kCifar{3, 32, 32};

std::string ShapeName(InputShape input) {
  return std::to_string(input.channels) + "x" + std::to_string(input.height) + "x" +
         std::to_string(input.width);
}

// Small batches keep ResNet-18 and VGG-11 cheap on a CPU; batch norm needs more than one sample.
int64_t SmallBatch(const std::string& name) {
  return name == "resnet18" || name == "vgg11" ? 2 : 4;
}

torch::Tensor Images(int64_t batch, InputShape input) {
  return torch::randn({batch, input.channels, input.height, input.width});
}

int64_t CountParameters(Network& network) {
  int64_t count = 0;
  for (const auto& parameter : network.parameters()) count += parameter.numel();
  return count;
}

std::shared_ptr<Network> Make(const std::string& name, InputShape input, uint64_t seed = 1) {
  torch::manual_seed(seed);
  return MakeNetwork(name, input, 10);
}

struct Case {
  std::string name;
  InputShape input;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " on " << ShapeName(c.input); }

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& name : NetworkNames()) {
    cases.push_back({name, kMnist});
    cases.push_back({name, kCifar});
  }
  return cases;
}

class NetworkTest : public testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(AllNetworks, NetworkTest, testing::ValuesIn(AllCases()),
                         [](const testing::TestParamInfo<Case>& info) {
                           return info.param.name + "_" +
                                  std::to_string(info.param.input.channels) + "x" +
                                  std::to_string(info.param.input.height);
                         });

TEST(NetworkNamesTest, ListsTheFourFamilies) {
  EXPECT_THAT(NetworkNames(), testing::ElementsAre("mlp", "lenet", "resnet18", "vgg11"));
}

TEST_P(NetworkTest, MapsABatchOfImagesToLogits) {
  const auto& [name, input] = GetParam();
  auto network = Make(name, input);
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = network->forward(Images(4, input));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4, 10})) << name << " on " << ShapeName(input);
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());

  network->eval();  // batch norm from running statistics
  EXPECT_EQ(network->forward(Images(1, input)).sizes(), (std::vector<int64_t>{1, 10}));
}

TEST(MakeNetworkTest, HonoursTheClassCount) {
  for (const std::string& name : NetworkNames()) {
    torch::manual_seed(1);
    auto network = MakeNetwork(name, kMnist, 3);
    torch::NoGradGuard no_grad;
    EXPECT_EQ(network->forward(Images(2, kMnist)).sizes(), (std::vector<int64_t>{2, 3})) << name;
  }
}

// Counts derived by hand (weights + biases; batch norm: gamma + beta per channel):
//   mlp 784:      784*512+512 + 512*512+512 + 512*10+10                      = 669,706
//   mlp 3072:     3072*512+512 + 262,656 + 5,130                             = 1,841,162
//   lenet 1ch:    (1*6*25+6) + (6*16*25+16) + (400*120+120) + (120*84+84) + (84*10+10) = 61,706
//   lenet 3ch:    the first conv has 3*6*25+6 = 456 instead of 156           = 62,006
//   resnet18 3ch: stem 1,728 + 128; layer1 147,968; layer2 525,568; layer3 2,099,712;
//                 layer4 8,393,728; fc 5,130                                 = 11,173,962
//   resnet18 1ch: the stem conv has 1*64*9 = 576 instead of 1,728           = 11,172,810
//   vgg11 3ch:    convs 9,220,480 (with bias) + batch norms 5,504 + fc 5,130 = 9,231,114
//   vgg11 1ch:    the first conv has 1*64*9+64 = 640 instead of 1,792        = 9,229,962
TEST(MakeNetworkTest, HasTheExpectedNumberOfParameters) {
  const std::map<std::pair<std::string, int64_t>, int64_t> expected = {
      {{"mlp", 1}, 669'706},     {{"mlp", 3}, 1'841'162},       {{"lenet", 1}, 61'706},
      {{"lenet", 3}, 62'006},    {{"resnet18", 1}, 11'172'810}, {{"resnet18", 3}, 11'173'962},
      {{"vgg11", 1}, 9'229'962}, {{"vgg11", 3}, 9'231'114},
  };
  for (const auto& [key, count] : expected) {
    const auto& [name, channels] = key;
    auto network = Make(name, channels == 1 ? kMnist : kCifar);
    EXPECT_EQ(CountParameters(*network), count) << name << " with " << channels << " channels";
  }
}

TEST(MakeNetworkTest, ParameterNamesAreStable) {
  std::vector<std::string> names;
  for (const auto& item : Make("resnet18", kCifar)->named_parameters()) names.push_back(item.key());
  ASSERT_EQ(names.size(), 62u);
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_EQ(names[2], "bn1.bias");
  EXPECT_EQ(names[3], "layer1.0.conv1.weight");
  EXPECT_THAT(names, testing::Contains("layer2.0.shortcut_conv.weight"));
  EXPECT_EQ(names.back(), "fc.bias");

  names.clear();
  for (const auto& item : Make("vgg11", kCifar)->named_parameters()) names.push_back(item.key());
  EXPECT_THAT(
      names,
      testing::ElementsAreArray(
          {"conv1.weight", "conv1.bias", "bn1.weight",   "bn1.bias",   "conv2.weight", "conv2.bias",
           "bn2.weight",   "bn2.bias",   "conv3.weight", "conv3.bias", "bn3.weight",   "bn3.bias",
           "conv4.weight", "conv4.bias", "bn4.weight",   "bn4.bias",   "conv5.weight", "conv5.bias",
           "bn5.weight",   "bn5.bias",   "conv6.weight", "conv6.bias", "bn6.weight",   "bn6.bias",
           "conv7.weight", "conv7.bias", "bn7.weight",   "bn7.bias",   "conv8.weight", "conv8.bias",
           "bn8.weight",   "bn8.bias",   "fc.weight",    "fc.bias"}));
}

// The gated modules own every parameter exactly once between them, in named_parameters() order,
// and every forward() gates them again.
TEST_P(NetworkTest, GatesCoverEveryParameterOnceInOrder) {
  const auto& [name, input] = GetParam();
  auto network = Make(name, input);
  std::vector<const void*> expected;
  for (const auto& parameter : network->parameters()) {
    expected.push_back(parameter.unsafeGetTensorImpl());
  }
  std::vector<const void*> gated;
  network->set_gate([&](torch::nn::Module& layer) {
    for (const auto& parameter : layer.parameters()) {
      gated.push_back(parameter.unsafeGetTensorImpl());
    }
  });
  torch::NoGradGuard no_grad;
  for (int pass = 0; pass < 2; ++pass) {
    gated.clear();
    network->forward(Images(SmallBatch(name), input));
    EXPECT_EQ(gated, expected) << name << " on " << ShapeName(input) << ", pass " << pass;
  }
}

// What the Trainer relies on: a layer's weights may still be in flight until its gate is called.
// The network starts with NaN everywhere and each gate fills in the layer's real weights; the
// output matches the untouched twin only if no parameter is read before its gate.
TEST_P(NetworkTest, ReadsNoParameterBeforeItsGate) {
  const auto& [name, input] = GetParam();
  auto reference = Make(name, input, 7);
  auto gated = Make(name, input, 7);
  std::map<const torch::nn::Module*, std::shared_ptr<torch::nn::Module>> twin;
  auto reference_modules = reference->named_modules();
  for (const auto& item : gated->named_modules()) {
    twin[item.value().get()] = reference_modules[item.key()];
  }
  torch::NoGradGuard no_grad;
  for (auto& parameter : gated->parameters()) parameter.fill_(NAN);
  int gates = 0;
  gated->set_gate([&](torch::nn::Module& layer) {
    ++gates;
    auto source = twin.at(&layer)->parameters();
    auto target = layer.parameters();
    ASSERT_EQ(source.size(), target.size());
    for (size_t i = 0; i < target.size(); ++i) target[i].copy_(source[i]);
  });

  const torch::Tensor images = Images(SmallBatch(name), input);
  const torch::Tensor expected = reference->forward(images);
  const torch::Tensor actual = gated->forward(images);
  EXPECT_GT(gates, 0);
  EXPECT_TRUE(torch::isfinite(actual).all().item<bool>()) << name << " on " << ShapeName(input);
  EXPECT_TRUE(torch::allclose(actual, expected)) << name << " on " << ShapeName(input);
}

TEST_P(NetworkTest, SameSeedSameParametersOtherSeedOthers) {
  const auto& [name, input] = GetParam();
  auto first = Make(name, input, 42)->named_parameters();
  auto again = Make(name, input, 42)->named_parameters();
  auto other = Make(name, input, 43)->named_parameters();
  ASSERT_EQ(first.size(), again.size());
  ASSERT_EQ(first.size(), other.size());
  for (size_t i = 0; i < first.size(); ++i) {
    const std::string& key = first[i].key();
    EXPECT_EQ(again[i].key(), key);
    EXPECT_TRUE(torch::equal(first[i].value(), again[i].value())) << name << " " << key;
    // Weights of convolutions and linear layers are random; batch norm starts at 1 and 0, and
    // biases may start at 0.
    if (first[i].value().dim() > 1) {
      EXPECT_FALSE(torch::equal(first[i].value(), other[i].value())) << name << " " << key;
    }
  }
}

TEST_P(NetworkTest, BackwardReachesEveryParameter) {
  const auto& [name, input] = GetParam();
  auto network = Make(name, input);
  const int64_t batch = SmallBatch(name);
  const torch::Tensor labels = torch::arange(batch) % 10;
  torch::cross_entropy_loss(network->forward(Images(batch, input)), labels).backward();
  for (const auto& item : network->named_parameters()) {
    const torch::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << name << " " << item.key();
    EXPECT_EQ(grad.sizes(), item.value().sizes()) << name << " " << item.key();
    EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << name << " " << item.key();
    // A conv bias right before batch norm has a zero gradient in theory (the batch mean is
    // subtracted), so only weights must have moved.
    if (item.key().ends_with("weight")) {
      EXPECT_GT(grad.abs().sum().item<double>(), 0.0) << name << " " << item.key();
    }
  }
}

TEST(MakeNetworkTest, RejectsAnUnknownNameListingTheKnownOnes) {
  try {
    MakeNetwork("resnet50", kCifar, 10);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_THAT(message, testing::HasSubstr("resnet50"));
    for (const std::string& name : NetworkNames()) {
      EXPECT_THAT(message, testing::HasSubstr(name));
    }
  }
}

TEST(MakeNetworkTest, RejectsBadShapesAndClassCounts) {
  EXPECT_THROW(MakeNetwork("mlp", {0, 28, 28}, 10), InvalidArgument);
  EXPECT_THROW(MakeNetwork("vgg11", {3, 32, -1}, 10), InvalidArgument);
  EXPECT_THROW(MakeNetwork("lenet", kMnist, 0), InvalidArgument);
  EXPECT_THROW(MakeNetwork("lenet", {1, 11, 11}, 10), InvalidArgument);
  EXPECT_NO_THROW(MakeNetwork("lenet", {1, 12, 12}, 10));
}

}  // namespace
}  // namespace dtrain::train
