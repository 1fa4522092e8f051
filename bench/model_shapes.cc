#include "model_shapes.h"

#include <stdexcept>

namespace dtrain::bench {
namespace {

using Tensors = std::vector<ParameterTensor>;

void Conv(Tensors& t, const std::string& name, int64_t in, int64_t out, int64_t k, bool bias) {
  t.push_back({name + ".weight", in * out * k * k});
  if (bias) t.push_back({name + ".bias", out});
}
void Norm(Tensors& t, const std::string& name, int64_t channels) {
  t.push_back({name + ".weight", channels});
  t.push_back({name + ".bias", channels});
}
void Linear(Tensors& t, const std::string& name, int64_t in, int64_t out) {
  t.push_back({name + ".weight", in * out});
  t.push_back({name + ".bias", out});
}

Tensors LeNet() {
  Tensors t;
  Conv(t, "conv1", 1, 6, 5, true);
  Conv(t, "conv2", 6, 16, 5, true);
  Linear(t, "fc1", 16 * 5 * 5, 120);
  Linear(t, "fc2", 120, 84);
  Linear(t, "fc3", 84, 10);
  return t;
}

// dtrain-train's MLP (src/train/models/mlp.cc) on 28 x 28 images.
Tensors Mlp() {
  Tensors t;
  Linear(t, "fc1", 28 * 28, 512);
  Linear(t, "fc2", 512, 512);
  Linear(t, "fc3", 512, 10);
  return t;
}

// torchvision's ResNets: basic blocks (18) or bottlenecks (50), a 1x1 projection where the shape
// changes.
Tensors ResNet(bool bottleneck, const std::vector<int>& blocks) {
  Tensors t;
  Conv(t, "conv1", 3, 64, 7, false);
  Norm(t, "bn1", 64);
  const int64_t expansion = bottleneck ? 4 : 1;
  int64_t in = 64;
  for (size_t stage = 0; stage < blocks.size(); ++stage) {
    const int64_t width = int64_t{64} << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      const int64_t out = width * expansion;
      if (bottleneck) {
        Conv(t, p + ".conv1", in, width, 1, false);
        Norm(t, p + ".bn1", width);
        Conv(t, p + ".conv2", width, width, 3, false);
        Norm(t, p + ".bn2", width);
        Conv(t, p + ".conv3", width, out, 1, false);
        Norm(t, p + ".bn3", out);
      } else {
        Conv(t, p + ".conv1", in, width, 3, false);
        Norm(t, p + ".bn1", width);
        Conv(t, p + ".conv2", width, width, 3, false);
        Norm(t, p + ".bn2", width);
      }
      if (b == 0 && (in != out || stage > 0)) {
        Conv(t, p + ".downsample.0", in, out, 1, false);
        Norm(t, p + ".downsample.1", out);
      }
      in = out;
    }
  }
  Linear(t, "fc", in, 1000);
  return t;
}

Tensors Vgg16() {
  Tensors t;
  const int64_t widths[] = {64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512};
  int64_t in = 3;
  int i = 0;
  for (int64_t w : widths) {
    Conv(t, "features." + std::to_string(i++), in, w, 3, true);
    in = w;
  }
  Linear(t, "classifier.0", 512 * 7 * 7, 4096);
  Linear(t, "classifier.3", 4096, 4096);
  Linear(t, "classifier.6", 4096, 1000);
  return t;
}

Tensors BertBase() {
  const int64_t hidden = 768, intermediate = 3072;
  Tensors t;
  t.push_back({"embeddings.word", 30522 * hidden});
  t.push_back({"embeddings.position", 512 * hidden});
  t.push_back({"embeddings.token_type", 2 * hidden});
  Norm(t, "embeddings.norm", hidden);
  for (int layer = 0; layer < 12; ++layer) {
    const std::string p = "encoder." + std::to_string(layer);
    for (const char* part : {".query", ".key", ".value", ".attention_output"}) {
      Linear(t, p + part, hidden, hidden);
    }
    Norm(t, p + ".attention_norm", hidden);
    Linear(t, p + ".intermediate", hidden, intermediate);
    Linear(t, p + ".output", intermediate, hidden);
    Norm(t, p + ".output_norm", hidden);
  }
  Linear(t, "pooler", hidden, hidden);
  return t;
}

}  // namespace

std::vector<std::string> KnownModels() {
  return {"lenet", "mlp", "resnet18", "resnet50", "vgg16", "bert-base"};
}

std::vector<ParameterTensor> ModelParameters(const std::string& model) {
  if (model == "lenet") return LeNet();
  if (model == "mlp") return Mlp();
  if (model == "resnet18") return ResNet(false, {2, 2, 2, 2});
  if (model == "resnet50") return ResNet(true, {3, 4, 6, 3});
  if (model == "vgg16") return Vgg16();
  if (model == "bert-base") return BertBase();
  std::string known;
  for (const auto& m : KnownModels()) known += (known.empty() ? "" : ", ") + m;
  throw std::invalid_argument("unknown model '" + model + "' (known: " + known + ")");
}

}  // namespace dtrain::bench
