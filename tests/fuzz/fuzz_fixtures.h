// The files the fuzz targets' inputs refer to, written once by the targets and read by the seed
// writer (tests/fuzz/write_seeds.cpp) from the same code: the images and point cloud beside a
// transforms.json, and the images of the COLMAP fixture.
#pragma once

#include <cmath>
#include <string>

#include "framework/data/import.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/import_fixtures.h"

namespace tessera::fuzz {

constexpr int kTransformsImages = 5;  // images/0.png .. images/3.png, images/4.jpg

inline std::string transforms_image_name(int i) {
  return "images/" + std::to_string(i) + (i == kTransformsImages - 1 ? ".jpg" : ".png");
}

// `dir`/images/* (16 x 12; 3.png has alpha) and `dir`/points3D.ply (ten points, binary).
inline void write_transforms_assets(const std::string& dir) {
  using namespace tessera::test;
  for (int i = 0; i < kTransformsImages; ++i) {
    const std::string path = dir + "/" + transforms_image_name(i);
    if (i == 3) {
      write_rgba(path, kFixtureWidth, kFixtureHeight, i);
    } else if (i == kTransformsImages - 1) {
      const auto rgb = pattern(kFixtureWidth, kFixtureHeight, i);
      stbi_write_jpg(path.c_str(), kFixtureWidth, kFixtureHeight, 3, rgb.data_ptr<uint8_t>(), 95);
    } else {
      write_png_in(path, pattern(kFixtureWidth, kFixtureHeight, i));
    }
  }
  const auto xyz = torch::linspace(-1, 1, 30, torch::kFloat64).reshape({10, 3});
  const auto rgb = torch::arange(30, torch::kInt64).to(torch::kUInt8).reshape({10, 3});
  data::write_ply_points(dir + "/points3D.ply", xyz, rgb);
}

// The COLMAP fixture under `root` (its images in `root`/images); the model is the caller's to write.
inline test::ColmapFixture write_colmap_assets(const std::string& root) {
  return test::colmap_fixture(root);
}

// The checks after a parser accepted a source: one image per camera, and finish_import (with and
// without normalization) accepts it or raises UserError, giving finite bounds and 0 <= near < far.
inline void check_import(const std::string& what, const data::ParsedSource& parsed) {
  if (parsed.image_paths.size() != parsed.cameras.size())
    finding(what + ": " + std::to_string(parsed.cameras.size()) + " cameras, " +
            std::to_string(parsed.image_paths.size()) + " images");
  for (const bool normalize : {true, false}) {
    data::ImportOptions options;
    options.normalize = normalize;
    accepts("finish_import", [&] {
      const data::ImportedScene scene = data::finish_import(parsed, options);
      for (const double b : scene.meta.scene_bounds)
        if (!std::isfinite(b)) finding(what + ": imported bounds are not finite");
      if (!(scene.meta.near >= 0 && scene.meta.near < scene.meta.far && std::isfinite(scene.meta.far)))
        finding(what + ": imported near " + std::to_string(scene.meta.near) + ", far " +
                std::to_string(scene.meta.far));
    });
  }
}

}  // namespace tessera::fuzz
