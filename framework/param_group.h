// ParamGroup: trainable tensors that share optimizer settings, as a family lists them for Adam
// and for its snapshot names (e.g. "hash_grid", "mlp", "means").
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

namespace tessera {

struct ParamGroup {
  std::string name;
  std::vector<torch::Tensor> params;
};

}  // namespace tessera
