// Loads a TOML config and its --set overrides into the typed Config, reporting every problem with
// its file:line (or override) and key; also writes the resolved config back out as TOML.
#include "framework/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include <toml++/toml.h>

#include "distributed/errors.h"
#include "framework/config_schema.h"

namespace tessera {
namespace {

namespace cs = config_schema;

// "Did you mean" is offered when the edit distance is at most
// max(kMinSuggestDistance, length / kSuggestLengthDivisor): a typo, not a different word.
constexpr size_t kMinSuggestDistance = 2;
constexpr size_t kSuggestLengthDivisor = 3;
// A right key name placed in the wrong section counts as this close to a typo.
constexpr size_t kWrongSectionDistance = 1;
// Bytes read from the config file per fread call.
constexpr size_t kReadChunkBytes = 1 << 16;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool close_enough(size_t distance, const std::string& typed) {
  return distance <= std::max(kMinSuggestDistance, typed.size() / kSuggestLengthDivisor);
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

bool is_section(const std::string& name) {
  const auto& all = cs::sections();
  return std::find(all.begin(), all.end(), name) != all.end();
}

const cs::KeySpec* find_key(const std::string& section, const std::string& name) {
  for (const auto& spec : cs::schema()) {
    if (spec.section == section && spec.name == name) return &spec;
  }
  return nullptr;
}

// Closest known dotted key to `section.name` (`section` empty: a key outside any section).
std::optional<std::string> suggest_key(const std::string& section, const std::string& name) {
  const std::string typed = section.empty() ? name : section + "." + name;
  size_t best = SIZE_MAX;
  std::string best_key;
  for (const auto& spec : cs::schema()) {
    size_t d = edit_distance(typed, spec.dotted());
    if (section.empty() || spec.section == section) d = std::min(d, edit_distance(name, spec.name));
    if (spec.name == name) d = std::min(d, kWrongSectionDistance);
    if (d < best) {
      best = d;
      best_key = spec.dotted();
    }
  }
  if (best_key.empty() || !close_enough(best, name)) return std::nullopt;
  return best_key;
}

std::string unknown_key_message(const std::string& section, const std::string& name) {
  std::string msg = "unknown key '" + section + "." + name + "'";
  if (auto guess = suggest_key(section, name)) return msg + " (did you mean '" + *guess + "'?)";
  std::vector<std::string> known;
  for (const auto& spec : cs::schema()) {
    if (spec.section == section) known.push_back(spec.name);
  }
  if (known.empty()) return msg + " ([" + section + "] has no keys yet)";
  return msg + " (known keys in [" + section + "]: " + join(known, ", ") + ")";
}

std::string unknown_section_message(const std::string& section) {
  std::string msg = "unknown section '" + section + "'";
  size_t best = SIZE_MAX;
  std::string best_section;
  for (const auto& known : cs::sections()) {
    const size_t d = edit_distance(section, known);
    if (d < best) {
      best = d;
      best_section = known;
    }
  }
  if (close_enough(best, section)) msg += " (did you mean '" + best_section + "'?)";
  return msg + "; known sections: " + join(cs::sections(), ", ");
}

std::string outside_section_message(const std::string& name) {
  std::string msg = "key '" + name + "' is outside any section; put it under a [section]";
  if (auto guess = suggest_key("", name)) msg += " (did you mean '" + *guess + "'?)";
  return msg;
}

std::string node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

// Converts `node` to the spec's kind (an integer is accepted for a float, never the reverse).
// Returns the problem in `error` when the type is wrong.
std::optional<cs::Value> convert(const cs::KeySpec& spec, const toml::node& node,
                                 std::string& error) {
  switch (spec.kind) {
    case cs::ValueKind::kString:
      if (auto s = node.value_exact<std::string>()) return cs::Value(*s);
      break;
    case cs::ValueKind::kInteger:
      if (auto i = node.value_exact<int64_t>()) return cs::Value(*i);
      break;
    case cs::ValueKind::kFloat:
      if (auto f = node.value_exact<double>()) return cs::Value(*f);
      if (auto i = node.value_exact<int64_t>()) return cs::Value(static_cast<double>(*i));
      break;
    case cs::ValueKind::kBool:
      if (auto b = node.value_exact<bool>()) return cs::Value(*b);
      break;
  }
  const std::string kind = cs::kind_name(spec.kind);
  const std::string article = spec.kind == cs::ValueKind::kInteger ? "an " : "a ";
  error = "key '" + spec.dotted() + "' must be " + article + kind + ", got " + node_type_name(node);
  if (node.is_table()) error += " (tables nest no deeper than section.key)";
  return std::nullopt;
}

std::string trim(const std::string& s) {
  const char* const kSpace = " \t\r\n";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

struct Problem {
  uint32_t line = 0;
  uint32_t column = 0;
  std::string message;  // complete, starting with its location
};

// Collects assignments from the file and the overrides, then resolves them into a Config.
class ConfigBuilder {
 public:
  // `stored`: the text is a config a snapshot stored (parse_stored_config), from this or an
  // earlier Tessera; its keys the model does not read are dropped, not refused.
  ConfigBuilder(std::string origin, cs::DefaultContext context, bool stored)
      : origin_(std::move(origin)), context_(std::move(context)), stored_(stored) {}

  void add_file(const toml::table& root) {
    for (const auto& [key, node] : root) {
      const std::string name(key.str());
      const toml::source_position pos = position(key, node);
      const std::string where = location(pos);
      if (!is_section(name)) {
        add(pos, where + (node.is_table() ? unknown_section_message(name)
                                          : outside_section_message(name)));
      } else if (!node.is_table()) {
        add(pos, where + "section '" + name + "' must be a table ([" + name + "]), got " +
                     node_type_name(node));
      } else {
        for (const auto& [sub_key, sub_node] : *node.as_table()) {
          const toml::source_position sub_pos = position(sub_key, sub_node);
          assign(name, std::string(sub_key.str()), sub_node, location(sub_pos), sub_pos, true);
        }
      }
    }
    // toml++ tables are ordered by key: report in file order instead.
    std::stable_sort(problems_.begin(), problems_.end(), [](const Problem& a, const Problem& b) {
      return std::tie(a.line, a.column) < std::tie(b.line, b.column);
    });
  }

  void add_override(const std::string& text) {
    const std::string where = "--set " + text + ": ";
    const size_t eq = text.find('=');
    if (eq == std::string::npos) {
      return add({}, where + "expected section.key=value (missing '=')");
    }
    const std::string dotted = trim(text.substr(0, eq));
    const std::string value_text = trim(text.substr(eq + 1));
    if (dotted.empty()) return add({}, where + "empty key; expected section.key=value");
    const size_t dot = dotted.find('.');
    if (dot == std::string::npos) return add({}, where + outside_section_message(dotted));
    const std::string section = dotted.substr(0, dot);
    const std::string name = dotted.substr(dot + 1);
    if (!is_section(section)) return add({}, where + unknown_section_message(section));
    if (name.empty() || name.find('.') != std::string::npos) {
      return add({}, where + "key '" + dotted + "' must be section.key (one level of nesting)");
    }
    const cs::KeySpec* spec = find_key(section, name);
    if (!spec) return add({}, where + unknown_key_message(section, name));

    // A TOML value if it parses as one ("500", "true", "\"quoted\""), else the raw text.
    // For a string key the raw text always wins unless quoted, so run.name=2024 is a name.
    std::optional<toml::table> parsed;
    try {
      parsed = toml::parse("v = " + value_text, std::string_view("--set"));
    } catch (const toml::parse_error&) {
    }
    const toml::node* node = parsed && parsed->size() == 1 ? parsed->get("v") : nullptr;
    const toml::value<std::string> raw(value_text);
    if (!node || (spec->kind == cs::ValueKind::kString && !node->is_string())) node = &raw;
    assign(section, name, *node, where, {}, false);
  }

  Config finish(const std::string& source_path) {
    Config config;
    config.source_path = source_path;
    const std::string model = model_name();
    if (stored_) place_moved_keys(model);
    refuse_unread_keys(model);
    refuse_values_the_model_lacks(model);
    for (const auto& spec : cs::schema()) {
      const auto it = values_.find(spec.dotted());
      if (it != values_.end()) {
        spec.set(config, it->second);
        continue;
      }
      const cs::Value value = spec.fixed_default ? *spec.fixed_default
                                                 : spec.computed_default(config, context_);
      const std::string problem = cs::check_value(spec, value);
      if (!problem.empty()) {
        add({}, origin_ + ": " + problem + " (its default is " + spec.default_doc +
                    "; set '" + spec.dotted() + "' explicitly)");
      }
      spec.set(config, value);
    }
    if (!problems_.empty()) {
      std::vector<std::string> lines;
      for (const auto& p : problems_) lines.push_back(p.message);
      throw UserError(join(lines, "\n"));
    }
    return config;
  }

 private:
  static toml::source_position position(const toml::key& key, const toml::node& node) {
    return key.source().begin.line > 0 ? key.source().begin : node.source().begin;
  }

  std::string location(const toml::source_position& pos) const {
    return pos.line > 0 ? origin_ + ":" + std::to_string(pos.line) + ": " : origin_ + ": ";
  }

  void add(const toml::source_position& pos, std::string message) {
    problems_.push_back({pos.line, pos.column, std::move(message)});
  }

  void assign(const std::string& section, const std::string& name, const toml::node& node,
              const std::string& where, const toml::source_position& pos, bool from_file) {
    const cs::KeySpec* spec = find_key(section, name);
    if (!spec && stored_ && from_file) {
      moved_.push_back({name, &node, where, pos});  // placed once the model is known
      return;
    }
    if (!spec) return add(pos, where + unknown_key_message(section, name));
    store(*spec, node, where, pos, from_file);
  }

  void store(const cs::KeySpec& spec, const toml::node& node, const std::string& where,
             const toml::source_position& pos, bool from_file) {
    std::string error;
    const std::optional<cs::Value> value = convert(spec, node, error);
    if (!value) return add(pos, where + error);
    error = cs::check_value(spec, *value);
    if (!error.empty()) return add(pos, where + error);
    values_[spec.dotted()] = *value;
    set_at_[spec.dotted()] = {where, pos, from_file};
  }

  std::string model_name() const {
    const auto it = values_.find("model.name");
    if (it != values_.end()) return std::get<std::string>(it->second);
    const cs::KeySpec* spec = find_key("model", "name");
    return std::get<std::string>(*spec->fixed_default);
  }

  // A stored key the schema does not know: an earlier Tessera wrote the model's keys in [model]
  // and [train]; each now lives, under the same name, in the section of the family that reads
  // it. Keys no section of this model has were another model's: dropped.
  void place_moved_keys(const std::string& model) {
    for (const MovedKey& key : moved_) {
      const cs::KeySpec* target = nullptr;
      int matches = 0;
      for (const auto& spec : cs::schema()) {
        if (spec.name == key.name && cs::family_section(spec.section) && cs::reads(model, spec)) {
          target = &spec;
          ++matches;
        }
      }
      if (matches == 1 && !values_.count(target->dotted()))
        store(*target, *key.node, key.where, key.pos, true);
    }
  }

  // Every key set (in the file or by --set) must be read by the model: a key of another family,
  // or a framework key this model ignores, is refused by name. A stored config drops its own.
  void refuse_unread_keys(const std::string& model) {
    bool known_model = false;
    for (const std::string& name : cs::models()) known_model = known_model || name == model;
    if (!known_model) return;  // an unknown model.name is reported by the family registry
    for (const auto& spec : cs::schema()) {
      const auto it = set_at_.find(spec.dotted());
      if (it == set_at_.end() || cs::reads(model, spec)) continue;
      if (stored_ && it->second.from_file) {
        values_.erase(spec.dotted());
        continue;
      }
      const std::string readers = cs::readers_of(spec);
      add(it->second.pos, it->second.where + "key '" + spec.dotted() +
                              "' is not read by model '" + model + "'" +
                              (readers.empty() ? "" : " (only by " + readers + ")") +
                              "; remove it, or set model.name to a model that reads it");
    }
  }

  // A framework key whose values the model restricts (FamilyInfo::key_choices, e.g. the
  // checkpoint policies it implements) must be set to one of them.
  void refuse_values_the_model_lacks(const std::string& model) {
    for (const auto& spec : cs::schema()) {
      const std::vector<std::string> values = cs::model_choices(model, spec);
      const auto set = set_at_.find(spec.dotted());
      if (values.empty() || set == set_at_.end()) continue;
      const std::string& value = std::get<std::string>(values_.at(spec.dotted()));
      if (std::find(values.begin(), values.end(), value) != values.end()) continue;
      std::string list;
      for (const std::string& v : values) list += (list.empty() ? "" : ", ") + v;
      add(set->second.pos, set->second.where + "key '" + spec.dotted() + "' = \"" + value +
                               "\" is not one of model '" + model + "''s: " + list);
    }
  }

  struct SetAt {
    std::string where;
    toml::source_position pos;
    bool from_file = false;
  };
  struct MovedKey {
    std::string name;
    const toml::node* node;  // in the parsed file, which outlives the builder
    std::string where;
    toml::source_position pos;
  };

  std::string origin_;
  cs::DefaultContext context_;
  bool stored_ = false;
  std::map<std::string, cs::Value> values_;  // dotted key -> checked value; later ones win
  std::map<std::string, SetAt> set_at_;      // where each key of values_ was last set
  std::vector<MovedKey> moved_;              // stored keys to place by name (stored_ only)
  std::vector<Problem> problems_;
};

Config parse_impl(const std::string& text, const std::string& origin,
                  const std::vector<std::string>& overrides, const std::string& source_path,
                  bool stored) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(origin));
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    throw UserError(origin + ":" + std::to_string(begin.line) + ":" +
                    std::to_string(begin.column) + ": TOML syntax error: " +
                    std::string(e.description()));
  }
  cs::DefaultContext context;
  if (!source_path.empty()) context.file_stem = std::filesystem::path(source_path).stem().string();
  ConfigBuilder builder(origin, context, stored);
  builder.add_file(root);
  for (const auto& override_text : overrides) builder.add_override(override_text);
  return builder.finish(source_path);
}

std::string read_text_file(const std::string& path) {
  if (path.empty()) throw UserError("cannot read config file: the path is empty");
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw UserError(path + ": cannot read config file (" + std::strerror(errno) + ")");
  std::string text;
  std::vector<char> chunk(kReadChunkBytes);
  size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), file)) > 0) text.append(chunk.data(), n);
  const int error = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (error) throw UserError(path + ": cannot read config file (" + std::strerror(error) + ")");
  return text;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_impl(read_text_file(path), path, overrides, path, false);
}

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  return parse_impl(toml_text, origin, overrides, "", false);
}

Config parse_stored_config(const std::string& toml_text, const std::string& origin,
                           const std::vector<std::string>& overrides) {
  return parse_impl(toml_text, origin, overrides, "", true);
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  out << "# Resolved Tessera config";
  if (!config.source_path.empty()) {
    out << ", loaded from " << cs::format_value(cs::Value(config.source_path));
  }
  out << "\n";
  for (const auto& section : cs::sections()) {
    std::string body;
    for (const auto& spec : cs::schema()) {
      if (spec.section != section || !cs::reads(config.model.name, spec)) continue;
      body += spec.name + " = " + cs::format_value(spec.get(config)) + "\n";
    }
    if (!body.empty() || !cs::family_section(section)) out << "\n[" << section << "]\n" << body;
  }
  return out.str();
}

}  // namespace tessera
