// libFuzzer target for the job-control decoders (ps/node/control.h): the scheduler decodes a
// registration from every node that connects, and every node decodes the node table, barrier
// replies and failure notices. Whatever the input, each decoder must return or throw
// ProtocolError: no crash, no memory error, no undefined behaviour, no other exception. What
// decodes must survive a round trip through its encoder.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtrain/common/error.h"
#include "ps/node/control.h"

namespace {

using namespace dtrain::ps::control;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_control_decoder: %s\n", what);
  std::abort();
}

template <typename Decode, typename Check>
void Try(Decode decode, Check check) {
  try {
    check(decode());
  } catch (const dtrain::ProtocolError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Try([&] { return DecodeRegistration(text); },
      [](const Registration& r) {
        const Registration again = DecodeRegistration(EncodeRegistration(r));
        if (again.role != r.role || again.host != r.host || again.port != r.port ||
            again.requested_rank != r.requested_rank) {
          Fail("a registration changed in a round trip");
        }
      });
  Try([&] { return DecodeNodeTable(text); },
      [](const std::vector<dtrain::ps::NodeInfo>& nodes) {
        if (DecodeNodeTable(EncodeNodeTable(nodes)).size() != nodes.size()) {
          Fail("a node table changed size in a round trip");
        }
      });
  Try([&] { return DecodeBarrier(text); },
      [](const BarrierMessage& b) {
        if (DecodeBarrier(EncodeBarrier(b.group, b.sequence, b.setup)) != b) {
          Fail("a barrier changed");
        }
      });
  Try([&] { return DecodeFailure(text); }, [](const Failure&) {});
  Try([&] { return DecodeRejoin(text); },
      [](const Rejoin& r) {
        const Rejoin again = DecodeRejoin(EncodeRejoin(r));
        if (again.workers_barriers != r.workers_barriers || again.all_barriers != r.all_barriers ||
            again.setup_barriers != r.setup_barriers) {
          Fail("a rejoin changed");
        }
      });
  return 0;
}
