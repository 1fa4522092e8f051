// Holding the engine's rounds back while a group of collectives is submitted (Horovod's grouped
// collectives): SubmittedTogether in collectives.h, Engine::HoldRounds in engine.h.
#include "collectives/engine/engine_impl.h"
#include "dtrain/collectives/collectives.h"

namespace dtrain::collectives {

void Engine::Impl::ReleaseHeld() {
  if (held.empty()) return;
  const bool was_empty = queue.empty();
  for (Request& r : held) queue.push_back(std::move(r));
  held.clear();
  // As Submit: an idle engine starts a round at once. A busy one takes the whole group into its
  // next round, since the queue is taken whole.
  if (was_empty) wake.notify_one();
}

void Engine::HoldRounds() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ++impl_->holds;
}

void Engine::ReleaseRounds() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->holds > 0 && --impl_->holds == 0) impl_->ReleaseHeld();
}

}  // namespace dtrain::collectives
