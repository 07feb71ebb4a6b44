// Internal schema of the config: one KeySpec per key, from which loading, validation, to_toml
// and the reference doc are all driven. Only framework/config*.cpp include this header.
#pragma once

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
};

template <typename T>
constexpr ValueKind kind_of() {
  if constexpr (std::is_same_v<T, bool>) return ValueKind::kBool;
  else if constexpr (std::is_same_v<T, int64_t>) return ValueKind::kInteger;
  else if constexpr (std::is_same_v<T, double>) return ValueKind::kFloat;
  else {
    static_assert(std::is_same_v<T, std::string>, "config fields are string/int64/double/bool");
    return ValueKind::kString;
  }
}

// Starts a KeySpec. `field` is a generic lambda returning a reference to the struct member, so
// that one lambda serves both reading (const Config&) and storing (Config&).
template <typename Field>
KeySpec key(std::string section, std::string name, Field field) {
  using T = std::decay_t<decltype(field(std::declval<Config&>()))>;
  KeySpec spec;
  spec.section = std::move(section);
  spec.name = std::move(name);
  spec.kind = kind_of<T>();
  spec.get = [field](const Config& c) { return Value(field(c)); };
  spec.set = [field](Config& c, const Value& v) { field(c) = std::get<T>(v); };
  return spec;
}

// Every section, in the order of docs/config.md (sections without keys included).
const std::vector<std::string>& sections();
// Every key, in resolution order: a computed default may read keys listed before it.
const std::vector<KeySpec>& schema();

// Helpers shared by the loader and the reference.
std::string kind_name(ValueKind kind);       // "integer", "float", ...
std::string format_value(const Value& v);    // as a TOML literal: 600.0, "info", true
std::string describe_allowed(const KeySpec& spec);  // "[1, 1000000000]", "auto, mpi, nccl", ...
// "" if `v` satisfies the spec's range, choices and rule; otherwise the complete problem, e.g.
// "key 'train.steps' = 0 is out of range [1, 1000000000]".
std::string check_value(const KeySpec& spec, const Value& v);

}  // namespace tessera::config_schema
