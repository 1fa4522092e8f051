// GlooBackend's barrier among a context's ranks (gloo_backend.h). Unlike the other calls it has no
// buffers whose waits the watchdog could abort: the collective timeout bounds it.
#include <gloo/barrier.h>

#include "collectives/gloo/gloo_backend.h"

namespace dtrain::collectives {

void GlooBackend::GlooBarrier(const std::shared_ptr<gloo::Context>& context) {
  gloo::BarrierOptions opts(context);
  opts.setTimeout(timeout_);
  gloo::barrier(opts);
}

}  // namespace dtrain::collectives
