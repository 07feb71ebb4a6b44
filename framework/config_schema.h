// The schema of the config: one KeySpec per key, from which loading, validation, to_toml and the
// reference doc are all driven. The framework's sections are written in framework/config_schema.cpp;
// a model family declares its own section (its keys, bound to the fields of its options struct,
// whose member initializers are the defaults) and the framework keys it does not read, in its
// FamilyInfo (framework/family.h); docs/config.md explains the rules.
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "framework/config.h"

namespace tessera::config_schema {

enum class ValueKind { kString, kInteger, kFloat, kBool };

// Longest run of steps a key accepts: far beyond any real run, small enough to catch a typo'd
// exponent (train.steps and the families' step counts).
constexpr double kMaxSteps = 1e9;

// A key's value once it has been checked against its kind.
using Value = std::variant<std::string, int64_t, double, bool>;

// What a computed default may depend on besides keys earlier in the schema.
struct DefaultContext {
  std::string file_stem;  // stem of the config file; "" when parsed from text
};

// Describes one key. Built with key<...>() and the chained setters below, e.g.
//   key("train", "steps", [](auto& c) -> auto& { return c.train.steps; })
//       .defaults_to(30000).range(1, 1e9).doc("Optimizer steps.")
struct KeySpec {
  std::string section;
  std::string name;  // bare key within the section
  ValueKind kind = ValueKind::kString;
  std::string description;

  std::optional<Value> fixed_default;  // set by defaults_to()
  std::function<Value(const Config&, const DefaultContext&)> computed_default;
  std::string default_doc;  // how a computed default is derived (for the reference)

  std::optional<double> min;  // numeric bounds; `min_open` makes the lower bound exclusive
  std::optional<double> max;
  bool min_open = false;
  std::vector<std::string> choices;                   // allowed strings, if any
  std::function<std::string(const Value&)> rule;      // extra check: "" if ok, else the problem
  std::string rule_doc;                               // the rule, for the reference

  // The models that read this key (model.name values); empty: every model that reads its section.
  std::vector<std::string> models;
  // A framework key that only the models whose family declares it read (FamilyInfo::
  // shared_keys), e.g. a sampling schedule; the others (run, train, eval, ...) every model reads.
  bool declared_only = false;

  std::function<Value(const Config&)> get;
  std::function<void(Config&, const Value&)> set;

  std::string dotted() const { return section + "." + name; }

  template <typename T>
  KeySpec&& defaults_to(T v) && {
    if constexpr (std::is_same_v<T, bool>) {
      fixed_default = Value(v);
    } else if constexpr (std::is_arithmetic_v<T>) {
      fixed_default = kind == ValueKind::kFloat ? Value(static_cast<double>(v))
                                                : Value(static_cast<int64_t>(v));
    } else {
      fixed_default = Value(std::string(v));
    }
    return std::move(*this);
  }
  KeySpec&& defaults_by(std::string how,
                        std::function<Value(const Config&, const DefaultContext&)> fn) && {
    default_doc = std::move(how);
    computed_default = std::move(fn);
    return std::move(*this);
  }
  KeySpec&& at_least(double lo) && { min = lo; return std::move(*this); }
  KeySpec&& range(double lo, double hi) && { min = lo; max = hi; return std::move(*this); }
  KeySpec&& range_open_low(double lo, double hi) && {
    min = lo; max = hi; min_open = true; return std::move(*this);
  }
  KeySpec&& one_of(std::vector<std::string> allowed) && {
    choices = std::move(allowed); return std::move(*this);
  }
  KeySpec&& check(std::string how, std::function<std::string(const Value&)> fn) && {
    rule_doc = std::move(how); rule = std::move(fn); return std::move(*this);
  }
  KeySpec&& doc(std::string text) && { description = std::move(text); return std::move(*this); }
  KeySpec&& opt_in() && { declared_only = true; return std::move(*this); }
  KeySpec&& only_for(std::vector<std::string> names) && {
    models = std::move(names); return std::move(*this);
  }
};

template <typename T>
constexpr ValueKind kind_of() {
  if constexpr (std::is_same_v<T, bool>) return ValueKind::kBool;
  else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, int>) return ValueKind::kInteger;
  else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) return ValueKind::kFloat;
  else {
    static_assert(std::is_same_v<T, std::string>,
                  "config fields are string, int64_t, int, double, float or bool");
    return ValueKind::kString;
  }
}

// A field's value as a Value: int widens to int64_t; a float becomes the double of its shortest
// text (1e-4f reads as 0.0001, not 9.99999974737875e-05), which narrows back to the same float.
template <typename T>
Value to_value(const T& v) {
  if constexpr (std::is_same_v<T, int>) {
    return Value(static_cast<int64_t>(v));
  } else if constexpr (std::is_same_v<T, float>) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    double wide = 0;
    std::from_chars(buf, end, wide);
    return Value(wide);
  } else {
    return Value(v);
  }
}

// Stores a checked Value into a field (ranges keep an int's or a float's value in range).
template <typename T>
void from_value(T& field, const Value& v) {
  if constexpr (std::is_same_v<T, int>) field = static_cast<int>(std::get<int64_t>(v));
  else if constexpr (std::is_same_v<T, float>) field = static_cast<float>(std::get<double>(v));
  else field = std::get<T>(v);
}

// Starts a KeySpec of a framework key. `field` is a generic lambda returning a reference to the
// Config member, so that one lambda serves both reading (const Config&) and storing (Config&).
template <typename Field>
KeySpec key(std::string section, std::string name, Field field) {
  using T = std::decay_t<decltype(field(std::declval<Config&>()))>;
  KeySpec spec;
  spec.section = std::move(section);
  spec.name = std::move(name);
  spec.kind = kind_of<T>();
  spec.get = [field](const Config& c) { return to_value(field(c)); };
  spec.set = [field](Config& c, const Value& v) { from_value(field(c), v); };
  return spec;
}

// Starts a KeySpec of a family section: `field` returns a reference to a member of the family's
// section struct S (Config::section<S>()), and the key's default is that member's initializer,
// so a family writes each default once, in S.
template <typename S, typename Field>
KeySpec section_key(std::string name, Field field) {
  using T = std::decay_t<decltype(field(std::declval<S&>()))>;
  KeySpec spec;
  spec.section = S::kSection;
  spec.name = std::move(name);
  spec.kind = kind_of<T>();
  const S defaults{};
  spec.fixed_default = to_value(field(defaults));
  spec.get = [field](const Config& c) { return to_value(field(c.section<S>())); };
  spec.set = [field](Config& c, const Value& v) { from_value(field(c.section<S>()), v); };
  return spec;
}

// A family's config section: [name], read by `models`, every key bound to the section struct.
struct SectionSpec {
  std::string name;
  std::vector<std::string> models;  // the model.name values that read it
  std::string doc;                  // one paragraph for the reference (docs/config.md)
  std::vector<KeySpec> keys;
};

// Adds a family's section to the schema (FamilyRegistry::add does, for each FamilyInfo). The
// same section again (several models of one family) is ignored; a different one of the same
// name, or a name of a framework section, is a std::logic_error.
void add_section(SectionSpec section);
// The values a model takes for a framework string key (FamilyInfo::key_choices).
struct KeyChoices {
  std::string key;                  // dotted name, e.g. "checkpoint.policy"
  std::vector<std::string> values;  // the key's default among them
};

// Records that `model` reads the opt-in framework keys `shared` (dotted names, or a section's
// name for all of its opt-in keys): a config that sets another opt-in key for this model is
// refused; and the values it takes for the keys in `choices`. Called by FamilyRegistry::add.
// std::logic_error for an entry that names no opt-in framework key, a choice for a key the
// model does not read or that is not a string key, or a list without the key's default.
void add_model(const std::string& model, std::vector<std::string> shared,
               std::vector<KeyChoices> choices = {});
// Makes `model` the default of model.name (FamilyRegistry::set_default_model).
void set_default_model(const std::string& model);
// The values `model` takes for `spec` (add_model's `choices`); empty: any the key allows.
std::vector<std::string> model_choices(const std::string& model, const KeySpec& spec);
// Whether `model` reads `spec`: a framework key that is not opt-in, an opt-in key it declared, or
// a key of its family's section; a model no family registered reads every framework key.
bool reads(const std::string& model, const KeySpec& spec);
// Models registered with add_model, in registration order.
std::vector<std::string> models();
// The models that read `spec`, for messages and the reference ("" when all do).
std::string readers_of(const KeySpec& spec);

// Every section, in the order of docs/config.md (sections without keys included): the
// framework's, then the families' in registration order.
const std::vector<std::string>& sections();
// Every key, in resolution order: a computed default may read keys listed before it. Family
// keys follow the framework's.
const std::vector<KeySpec>& schema();
// The family section `name`, or nullptr for a framework section.
const SectionSpec* family_section(const std::string& name);

// Helpers shared by the loader and the reference.
std::string kind_name(ValueKind kind);       // "integer", "float", ...
std::string format_value(const Value& v);    // as a TOML literal: 600.0, "info", true
std::string describe_allowed(const KeySpec& spec);  // "[1, 1000000000]", "auto, mpi, nccl", ...
// "" if `v` satisfies the spec's range, choices and rule; otherwise the complete problem, e.g.
// "key 'train.steps' = 0 is out of range [1, 1000000000]".
std::string check_value(const KeySpec& spec, const Value& v);

}  // namespace tessera::config_schema
