// One step of a torch::optim::Adam, fused per element on the CPU: torch's step makes seven passes
// over each parameter (mul_, add_, mul_, addcmul_, sqrt, div, add_, then addcdiv_), this one pass
// over the value, the gradient and the two moments, in parallel over chunks. At 59M parameter
// values that is most of the optimizer's time.
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

namespace tessera {

// The update of torch::optim::Adam::step (state created as torch creates it: step 0, zero
// moments; parameters without a gradient left alone), up to float rounding (torch's vectorized
// kernels fuse some multiply-adds), and bitwise the same for any thread count. Parameters that
// are not contiguous float32 CPU tensors, and groups with amsgrad or a weight decay, go through
// torch's own step instead.
void adam_step(torch::optim::Adam& adam);

}  // namespace tessera
