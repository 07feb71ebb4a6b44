// Gradient accumulation over micro-batches with bucketed gradient sync (docs/distributed.md): the
// backward of every micro-batch but the last accumulates locally; the last one's backward launches
// the buckets, and GradientSynchronizer::finish() completes them.
#pragma once

#include <torch/types.h>

#include "distributed/gradient_synchronizer.h"

namespace tessera {

// Backward of `loss` times `loss_scale` (fp16 loss scaling; 1 leaves the loss as it is),
// synchronized only when `last` is the step's last micro-batch.
inline void micro_batch_backward(distributed::GradientSynchronizer& sync, const torch::Tensor& loss,
                                 double loss_scale, bool last) {
  const torch::Tensor scaled = loss_scale == 1.0 ? loss : loss * loss_scale;
  if (last) {
    scaled.backward();
    return;
  }
  distributed::NoSyncScope no_sync(sync);
  scaled.backward();
}

}  // namespace tessera
