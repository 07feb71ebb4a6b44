// ModelRegistry: builds a Model from config.model.name; unknown names list the known ones.
#include <algorithm>

#include "distributed/errors.h"
#include "framework/model.h"

namespace tessera {

void ModelRegistry::add(const std::string& name, ModelFactory factory) {
  if (contains(name)) throw std::logic_error("model '" + name + "' registered twice");
  factories_.emplace_back(name, std::move(factory));
}

bool ModelRegistry::contains(const std::string& name) const {
  return std::any_of(factories_.begin(), factories_.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& entry : factories_) out.push_back(entry.first);
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<Model> ModelRegistry::create(const Config& config) const {
  for (const auto& [name, factory] : factories_)
    if (name == config.model.name) return factory(config);
  std::string known;
  for (const std::string& name : names()) known += (known.empty() ? "" : ", ") + name;
  if (known.empty()) known = "none in this build yet";
  throw UserError(config.source_path + ": unknown model.name '" + config.model.name +
                  "' (known: " + known + ")");
}

}  // namespace tessera
