// What the training run needs of any dataset, whatever its items are (a scene's camera views, a
// shape set's shapes): the items of each split, a fingerprint that ties snapshots to the data,
// and a line for the log. A family opens its kind of dataset (FamilyInfo::open_dataset,
// framework/family.h); its own code reads the concrete reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

enum class Split : uint8_t { Train = 0, Val = 1, Test = 2 };
const char* to_string(Split split);

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
};

}  // namespace tessera::data
