// Writes the seed corpus of fuzz_wire_decoder: one valid encoded message per kind that matters
// (control messages with JSON meta, value messages of every dtype, responses, errors), so that the
// fuzzer starts from inputs that pass the header checks. Each file is well under 1 KB.
//   fuzz_wire_seeds DIR
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "transport/wire.h"

namespace {

using namespace dtrain;
using namespace dtrain::transport;

Message Make(Command command, std::string meta, size_t body_bytes = 0,
             DType dtype = DType::kFloat32) {
  Message msg;
  msg.header.command = command;
  msg.header.sender = 9;
  msg.header.recipient = 1;
  msg.header.request_id = 7;
  msg.header.key = 3;
  msg.header.dtype = dtype;
  msg.meta = std::move(meta);
  if (body_bytes > 0) {
    auto buffer = std::shared_ptr<char[]>(new char[body_bytes]);
    for (size_t i = 0; i < body_bytes; ++i) buffer[i] = static_cast<char>(i);
    msg.body = Body{std::shared_ptr<void>(buffer, buffer.get()), buffer.get(), body_bytes};
  }
  return msg;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::vector<std::pair<std::string, Message>> seeds;
  seeds.emplace_back("hello", Make(Command::kHello, ""));
  seeds.emplace_back(
      "register", Make(Command::kRegister, R"({"role":"worker","host":"10.0.0.2","port":9000})"));
  seeds.emplace_back("node_table", Make(Command::kNodeTable, R"({"nodes":[[0,"scheduler"]]})"));
  seeds.emplace_back("barrier", Make(Command::kBarrier, R"({"group":7})"));
  Message push = Make(Command::kPush, "", 64);
  push.header.priority = -3;  // a layer's: -index
  seeds.emplace_back("push_f32", push);
  seeds.emplace_back("init_f64", Make(Command::kInit, R"({"shape":[4]})", 32, DType::kFloat64));
  seeds.emplace_back("pushpull_f16", Make(Command::kPushPull, "", 16, DType::kFloat16));
  Message response = Make(Command::kPull, "", 40, DType::kBFloat16);
  response.header.flags = kFlagResponse;
  response.header.priority = -3;
  seeds.emplace_back("pull_response", response);
  Message error = Make(Command::kPull, "unknown key 3");
  error.header.flags = kFlagResponse | kFlagError;
  seeds.emplace_back("pull_error", error);
  seeds.emplace_back("abort", Make(Command::kAbort, "server 2 died"));

  for (const auto& [name, msg] : seeds) {
    const std::string path = std::string(argv[1]) + "/" + name + ".bin";
    const std::string bytes = EncodeMessage(msg);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
      std::perror(path.c_str());
      return 1;
    }
    std::fclose(f);
  }
  return 0;
}
