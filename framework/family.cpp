// FamilyRegistry: model families by their config name; an unknown name lists the known ones.
#include <algorithm>

#include "distributed/errors.h"
#include "framework/family.h"

namespace tessera {

void FamilyRegistry::add(FamilyInfo info) {
  if (contains(info.name)) throw std::logic_error("model family '" + info.name + "' registered twice");
  if (!info.create) throw std::logic_error("model family '" + info.name + "' has no factory");
  for (const config_schema::SectionSpec& section : info.config_sections)
    config_schema::add_section(section);
  config_schema::add_model(info.name, info.unused_keys);
  families_.push_back(std::move(info));
}

bool FamilyRegistry::contains(const std::string& name) const {
  return std::any_of(families_.begin(), families_.end(),
                     [&](const FamilyInfo& f) { return f.name == name; });
}

std::vector<std::string> FamilyRegistry::names() const {
  std::vector<std::string> out;
  for (const FamilyInfo& f : families_) out.push_back(f.name);
  std::sort(out.begin(), out.end());
  return out;
}

const FamilyInfo& FamilyRegistry::get(const std::string& name, const std::string& origin) const {
  for (const FamilyInfo& f : families_)
    if (f.name == name) return f;
  std::string known;
  for (const std::string& entry : names()) known += (known.empty() ? "" : ", ") + entry;
  if (known.empty()) known = "none in this build";
  throw UserError(origin + ": unknown model.name '" + name + "' (known: " + known + ")");
}

}  // namespace tessera
