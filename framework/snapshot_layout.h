// Names, dtypes and checks shared by the snapshot writer, reader and validation (internal to
// framework/snapshot*.cpp; the layout itself is documented in docs/formats.md).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "framework/checksum.h"
#include "framework/data/h5.h"
#include "framework/snapshot.h"

namespace tessera::snapshot_layout {

// Root attributes.
constexpr const char* kFormatAttr = "format";
constexpr const char* kVersionAttr = "version";
constexpr const char* kStepAttr = "step";
constexpr const char* kModelAttr = "model";
constexpr const char* kConfigAttr = "config_toml";
constexpr const char* kWorldSizeAttr = "world_size";
constexpr const char* kFingerprintAttr = "dataset_fingerprint";
constexpr const char* kTesseraVersionAttr = "tessera_version";
constexpr const char* kChecksumKindAttr = "checksum_algorithm";
constexpr const char* kMetaChecksumAttr = "meta_checksum";    // over the attributes above
constexpr const char* kDatasetCountAttr = "dataset_count";  // written by commit()
constexpr const char* kChecksumKind = kChecksumAlgorithm;

// Dataset attributes.
constexpr const char* kChecksumAttr = "checksum";  // u64, checksum() of its bytes
constexpr const char* kDtypeAttr = "dtype";        // "float32", ..., "bool" (stored as u8)

// How a torch dtype is stored; nullopt for dtypes snapshots do not hold.
std::optional<data::h5::Type> stored_type(torch::ScalarType dtype);
// "float32", "float64", "int64", "int32", "uint8", "bool"; torch's name for others.
std::string dtype_name(torch::ScalarType dtype);
// The torch dtype of a stored dataset: from its `dtype` attribute when present, else from its
// HDF5 type; nullopt when the dataset holds something snapshots never write.
std::optional<torch::ScalarType> dataset_dtype(hid_t dataset);

// Throws std::invalid_argument unless `name` is a usable dataset path: non-empty components of
// printable ASCII separated by '/', none "." or "..". A leading '/' is dropped.
std::string checked_name(const std::string& name);

// The checksum of the root attributes (the meta), so that damage to them is detected too.
uint64_t meta_checksum(const SnapshotMeta& meta);

}  // namespace tessera::snapshot_layout
