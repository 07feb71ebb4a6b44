// Fixtures of the import tests, shared with the fuzz seed writer (tests/fuzz/write_seeds.cpp):
// patterned images, small files, and a COLMAP model written as text or binary with its images.
#pragma once

#include <stb/stb_image_write.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "framework/data/image_io.h"
#include "tests/pose_fixtures.h"

namespace tessera::test {

constexpr int kFixtureWidth = 16, kFixtureHeight = 12;  // fixture image size

// ---- Images and files ----------------------------------------------------------------------------

inline torch::Tensor pattern(int w, int h, int seed, int channels = 3) {
  auto t = torch::empty({h, w, channels}, torch::kUInt8);
  auto a = t.accessor<uint8_t, 3>();
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) a[y][x][c] = static_cast<uint8_t>((x * 13 + y * 7 + seed * 31 + c * 50) % 256);
  return t;
}

// write_png into a folder created as needed.
inline void write_png_in(const std::string& path, const torch::Tensor& rgb, const torch::Tensor& alpha = {}) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  data::write_png(path, rgb, alpha);
}

inline void write_rgba(const std::string& path, int w, int h, int seed) {
  const auto p = pattern(w, h, seed, 4);
  write_png_in(path, p.slice(2, 0, 3).contiguous(), p.select(2, 3).contiguous());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

inline void write_json(const std::string& path, const nlohmann::json& j) { write_text(path, j.dump(2)); }

// ---- COLMAP ----------------------------------------------------------------------------------------

struct ColmapCameraFixture {
  uint32_t id;
  std::string model;
  int width, height;
  std::vector<double> params;
};
struct ColmapImageFixture {
  uint32_t id;
  std::array<double, 4> q;
  Vec3 t;
  uint32_t camera_id;
  std::string name;
};
struct ColmapPointFixture {
  Vec3 xyz;
  std::array<uint8_t, 3> rgb;
};
struct ColmapFixture {
  std::vector<ColmapCameraFixture> cameras;
  std::vector<ColmapImageFixture> images;
  std::vector<ColmapPointFixture> points;
};

inline int model_id(const std::string& model) {
  const char* names[] = {"SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV",
                         "OPENCV_FISHEYE", "FULL_OPENCV"};
  for (int i = 0; i < 7; ++i)
    if (model == names[i]) return i;
  return 99;
}

inline void write_colmap_text(const std::string& dir, const ColmapFixture& f) {
  std::ostringstream cameras, images, points;
  cameras << std::setprecision(17) << "# Camera list\n# CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n";
  for (const auto& c : f.cameras) {
    cameras << c.id << " " << c.model << " " << c.width << " " << c.height;
    for (double p : c.params) cameras << " " << p;
    cameras << "\n";
  }
  images << std::setprecision(17) << "# Image list with two lines of data per image:\n";
  for (const auto& im : f.images) {
    images << im.id << " " << im.q[0] << " " << im.q[1] << " " << im.q[2] << " " << im.q[3] << " "
           << im.t[0] << " " << im.t[1] << " " << im.t[2] << " " << im.camera_id << " " << im.name << "\n";
    images << (im.id % 2 ? "" : "1.5 2.5 -1 3.5 4.5 7") << "\n";  // empty POINTS2D lines too
  }
  points << std::setprecision(17) << "# 3D point list\n";
  for (size_t i = 0; i < f.points.size(); ++i) {
    const auto& p = f.points[i];
    points << i + 1 << " " << p.xyz[0] << " " << p.xyz[1] << " " << p.xyz[2] << " " << int(p.rgb[0])
           << " " << int(p.rgb[1]) << " " << int(p.rgb[2]) << " 0.5 1 0 2 1\n";
  }
  write_text(dir + "/cameras.txt", cameras.str());
  write_text(dir + "/images.txt", images.str());
  write_text(dir + "/points3D.txt", points.str());
}

template <typename T>
inline void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

inline void write_colmap_binary(const std::string& dir, const ColmapFixture& f) {
  std::string cameras, images, points;
  put<uint64_t>(cameras, f.cameras.size());
  for (const auto& c : f.cameras) {
    put<uint32_t>(cameras, c.id);
    put<int32_t>(cameras, model_id(c.model));
    put<uint64_t>(cameras, c.width);
    put<uint64_t>(cameras, c.height);
    for (double p : c.params) put<double>(cameras, p);
  }
  put<uint64_t>(images, f.images.size());
  for (const auto& im : f.images) {
    put<uint32_t>(images, im.id);
    for (double q : im.q) put<double>(images, q);
    for (double t : im.t) put<double>(images, t);
    put<uint32_t>(images, im.camera_id);
    images.append(im.name);
    images.push_back('\0');
    put<uint64_t>(images, 2);
    for (int k = 0; k < 2; ++k) {
      put<double>(images, 1.5);
      put<double>(images, 2.5);
      put<int64_t>(images, -1);
    }
  }
  put<uint64_t>(points, f.points.size());
  for (size_t i = 0; i < f.points.size(); ++i) {
    put<uint64_t>(points, i + 1);
    for (double x : f.points[i].xyz) put<double>(points, x);
    for (uint8_t c : f.points[i].rgb) put<uint8_t>(points, c);
    put<double>(points, 0.5);
    put<uint64_t>(points, 1);
    put<int32_t>(points, 1);
    put<int32_t>(points, 0);
  }
  write_text(dir + "/cameras.bin", cameras);
  write_text(dir + "/images.bin", images);
  write_text(dir + "/points3D.bin", points);
}

inline std::array<double, 4> axis_angle_quaternion(const Vec3& axis, double angle) {
  const Vec3 a = normalize(axis);
  return {std::cos(angle / 2), a[0] * std::sin(angle / 2), a[1] * std::sin(angle / 2),
          a[2] * std::sin(angle / 2)};
}

// A COLMAP scene: images named out of order, rotated cameras, points around the origin, and
// the images written under `root`/images.
inline ColmapFixture colmap_fixture(const std::string& root, const std::string& model = "OPENCV",
                             std::vector<double> params = {14, 15, 8.5, 5.5, 0.01, -0.02, 0.001, 0.002}) {
  ColmapFixture f;
  f.cameras.push_back({1, model, kFixtureWidth, kFixtureHeight, params});
  f.cameras.push_back({7, "PINHOLE", 2 * kFixtureWidth, kFixtureHeight, {20, 21, 16, 6}});
  const char* names[] = {"c.png", "a.png", "sub/b.png", "d.jpg", "e.png"};
  for (uint32_t i = 0; i < 5; ++i) {
    const auto q = axis_angle_quaternion({0.3, 1.0, 0.2 * i}, 0.4 * i - 0.5);
    f.images.push_back({10 + i, q, {0.1 * i, -0.2, 4.0 + 0.1 * i}, i == 3 ? 7u : 1u, names[i]});
    const int w = i == 3 ? 2 * kFixtureWidth : kFixtureWidth;
    const std::string path = root + "/images/" + names[i];
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    if (i == 3) {
      const auto rgb = pattern(w, kFixtureHeight, i);
      stbi_write_jpg(path.c_str(), w, kFixtureHeight, 3, rgb.data_ptr<uint8_t>(), 95);
    } else {
      write_png_in(path, pattern(w, kFixtureHeight, i));
    }
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> unit(-1, 1);
  for (int i = 0; i < 300; ++i)
    f.points.push_back({{unit(rng), unit(rng), unit(rng)},
                        {uint8_t(i % 256), uint8_t(2 * i % 256), uint8_t(3 * i % 256)}});
  f.points.push_back({{1000, -1000, 1000}, {1, 2, 3}});  // a stray point, outside the percentiles
  return f;
}

}  // namespace tessera::test
