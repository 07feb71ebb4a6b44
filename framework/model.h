// The Model interface that the Trainer drives, and the registry that builds a model by its
// config name. Implementations live in models/ and register themselves there.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/config.h"

namespace tessera {

// Parameters that share optimizer settings (e.g. "hash_grid", "mlp", "means").
struct ParamGroup {
  std::string name;
  std::vector<torch::Tensor> params;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  virtual std::vector<ParamGroup> parameter_groups() = 0;
};

using ModelFactory = std::function<std::unique_ptr<Model>(const Config&)>;

// Models by name. An unknown name throws UserError listing the known ones.
class ModelRegistry {
 public:
  void add(const std::string& name, ModelFactory factory);
  std::unique_ptr<Model> create(const Config& config) const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;

 private:
  std::vector<std::pair<std::string, ModelFactory>> factories_;
};

}  // namespace tessera
