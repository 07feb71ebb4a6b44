// What the training run needs of any dataset, whatever its items are (a scene's camera views, a
// shape set's shapes): the items of each split, a fingerprint that ties snapshots to the data,
// and a line for the log. A family opens its kind of dataset (FamilyInfo::open_dataset,
// framework/family.h); its own code reads the concrete reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tessera::data {

class SceneReader;
namespace shapes {
class ShapesReader;
}  // namespace shapes

enum class Split : uint8_t { Train = 0, Val = 1, Test = 2 };

// One line of `tessera info`: a label ("cameras:") and its value.
using InfoLine = std::pair<std::string, std::string>;
const char* to_string(Split split);
// "train", "val" or "test" as a Split; UserError naming `name` and `what` (e.g. "eval.split")
// for anything else.
Split parse_split(const std::string& name, const std::string& what);

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const std::string& path() const = 0;
  // The items of `split`, ascending (camera indices of a scene, shape indices of a shape set).
  virtual std::vector<size_t> indices(Split split) const = 0;
  // 16 hex digits; equal for the same data, different when what the run depends on differs.
  // Snapshots record it and a resume refuses another dataset's.
  virtual std::string fingerprint() const = 0;
  // For the start log: "24 cameras", "1000 shapes of 2048 points".
  virtual std::string summary() const = 0;
  // `tessera info`: the format and its version ("tessera-scene version 2"), then what the file
  // holds, one labelled line each.
  virtual std::string format_version() const = 0;
  virtual std::vector<InfoLine> describe() const = 0;
  // The dataset as its concrete kind, or nullptr when it is another kind.
  virtual const SceneReader* as_scene() const { return nullptr; }
  virtual const shapes::ShapesReader* as_shapes() const { return nullptr; }
};

// Any Tessera dataset, by its root attribute 'format': a scene (SceneReader, docs/formats.md) or
// a shape set (shapes::ShapesReader). UserError naming the file for anything else.
std::unique_ptr<Dataset> open_any_dataset(const std::string& path);

// A describe() line's value: "85.4 MiB (89591318 bytes)".
std::string file_size_text(const std::string& path);

}  // namespace tessera::data
