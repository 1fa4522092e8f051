// GlooBackend's alltoallv among a context's ranks (gloo_backend.h), over the pairs between every
// two of them.
#include <gloo/alltoallv.h>

#include <cstdint>
#include <numeric>

#include "collectives/gloo/gloo_backend.h"

namespace dtrain::collectives {

void GlooBackend::GlooAlltoallv(const std::shared_ptr<gloo::Context>& context, const void* in,
                                const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes) {
  // Gloo wants a buffer even when nothing moves.
  static char empty = 0;
  const size_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
  const size_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  gloo::AlltoallvOptions opts(context);
  std::vector<gloo::transport::UnboundBuffer*> watched;
  opts.setInput<char>(Buffer(sent ? const_cast<void*>(in) : &empty, sent, &watched, context),
                      std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
  opts.setOutput<char>(Buffer(received ? out : &empty, received, &watched, context),
                       std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
  opts.setTimeout(timeout_);
  // After the options that own the buffers, so that it ends before they do.
  GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
  gloo::alltoallv(opts);
}

}  // namespace dtrain::collectives
