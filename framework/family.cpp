// FamilyRegistry: model families by their config name; an unknown name lists the known ones.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "distributed/errors.h"
#include "framework/family.h"

namespace tessera {

double EvalScores::value(const std::string& name) const {
  for (const auto& [key, v] : metrics)
    if (key == name) return v;
  return std::numeric_limits<double>::quiet_NaN();
}

std::string EvalScores::text() const {
  if (items == 0) return "none";
  std::string out;
  for (const auto& [key, v] : metrics) {
    char number[32];
    std::snprintf(number, sizeof number, "%.4g", v);  // 29.33, 0.9644, 0.0123
    out += key + " " + number + " ";
  }
  return out + "(" + std::to_string(items) + " " + unit + ")";
}

nlohmann::json EvalScores::to_json(const std::string& prefix) const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, v] : metrics) j[prefix + key] = v;
  j[prefix + unit] = items;
  return j;
}

EvalScores image_scores(int64_t views, double psnr, double ssim) {
  EvalScores scores;
  scores.items = views;
  scores.unit = "views";
  scores.metrics = {{"psnr", psnr}, {"ssim", ssim}};
  return scores;
}

const data::SceneReader& FamilyContext::scene() const {
  const data::SceneReader* scene = dataset.as_scene();
  if (!scene) throw std::logic_error("this family trains on views, but its dataset is not a scene");
  return *scene;
}

void FamilyRegistry::add(FamilyInfo info) {
  if (contains(info.name)) throw std::logic_error("model family '" + info.name + "' registered twice");
  if (!info.create) throw std::logic_error("model family '" + info.name + "' has no factory");
  for (const config_schema::SectionSpec& section : info.config_sections)
    config_schema::add_section(section);
  config_schema::add_model(info.name, info.shared_keys, info.key_choices);
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

void FamilyRegistry::set_default_model(const std::string& name) {
  if (!contains(name)) throw std::logic_error("default model '" + name + "' is not registered");
  config_schema::set_default_model(name);
}

const FamilyInfo& FamilyRegistry::get(const std::string& name, const std::string& origin) const {
  for (const FamilyInfo& f : families_)
    if (f.name == name) return f;
  std::string known;
  for (const std::string& entry : names()) known += (known.empty() ? "" : ", ") + entry;
  if (known.empty()) known = "none in this build";
  if (name.empty()) throw UserError(origin + ": model.name is not set (known: " + known + ")");
  throw UserError(origin + ": unknown model.name '" + name + "' (known: " + known + ")");
}

}  // namespace tessera
