// Private to scene*.cpp: the names, storage settings and shared checks of the tessera-scene v2
// layout (docs/formats.md), so that the writer and the reader cannot disagree.
#pragma once

#include <torch/types.h>

#include <hdf5.h>

#include <string>
#include <vector>

#include "framework/data/scene.h"

namespace tessera::data::layout {

// Root attributes.
constexpr const char* kFormatAttr = "format";
constexpr const char* kVersionAttr = "version";
constexpr const char* kBoundsAttr = "scene_bounds";
constexpr const char* kNearAttr = "near";
constexpr const char* kFarAttr = "far";
constexpr const char* kBackgroundAttr = "background";
constexpr const char* kSourceAttr = "source";
// Optional (absent in files written before them: extent = scene_bounds, identity transform).
constexpr const char* kExtentAttr = "scene_extent";
constexpr const char* kCaptureScaleAttr = "capture_scale";
constexpr const char* kCaptureOffsetAttr = "capture_offset";

// Groups and datasets (paths below the root, without the leading '/').
constexpr const char* kCameras = "cameras";
constexpr const char* kIntrinsics = "cameras/intrinsics";
constexpr const char* kDistortion = "cameras/distortion";
constexpr const char* kSize = "cameras/size";
constexpr const char* kCameraToWorld = "cameras/camera_to_world";
constexpr const char* kSplit = "cameras/split";
constexpr const char* kImages = "images";
constexpr const char* kRgb = "images/rgb";
constexpr const char* kAlpha = "images/alpha";
constexpr const char* kPoints = "points";
constexpr const char* kPointsXyz = "points/xyz";
constexpr const char* kPointsRgb = "points/rgb";

// Level 4 of 9: most of level 9's size reduction on images for a fraction of its write time;
// decoding (what training does) is about as fast at any level.
constexpr int kDeflateLevel = 4;
// Points are read whole; chunks of 64 Ki rows (768 KiB of f32 xyz) let deflate work on them
// while staying inside HDF5's default 1 MiB chunk cache.
constexpr hsize_t kPointsChunkRows = 65536;
// Digits of the per-image dataset names ("00000012"): room for 10^8 images.
constexpr int kImageNameDigits = 8;

// The per-image dataset name of camera `index` ("00000012").
std::string image_name(size_t index);

// Throws UserError naming `origin` when the root attributes are unusable: non-finite values,
// near < 0 or far <= near, a bounds minimum above its maximum, a background outside [0, 1].
void validate_meta(const SceneMeta& meta, const std::string& origin);

// "[800, 600, 3]" for error messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace tessera::data::layout
