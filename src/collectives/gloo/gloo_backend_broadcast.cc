// GlooBackend's broadcast among a context's ranks (gloo_backend.h).
#include <gloo/broadcast.h>

#include "collectives/gloo/gloo_backend.h"

namespace dtrain::collectives {

void GlooBackend::GlooBroadcast(const std::shared_ptr<gloo::Context>& context, void* data,
                                size_t bytes, int root) {
  gloo::BroadcastOptions opts(context);
  std::vector<gloo::transport::UnboundBuffer*> watched;
  opts.setOutput<char>(Buffer(data, bytes, &watched, context));
  opts.setRoot(root);
  opts.setTimeout(timeout_);
  // After the options that own the buffers, so that it ends before they do.
  GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
  gloo::broadcast(opts);
}

}  // namespace dtrain::collectives
