// Writes the fuzz targets' seed corpus with Tessera's own writers and the tests' fixtures:
//   write_seeds OUT_DIR SOURCE_DIR
// OUT_DIR/<target>/ gets a few valid inputs per target (config: the shipped configs/*.toml, some
// with overrides; scene: synthetic and imported scenes; snapshot: SnapshotWriter files; ply:
// write_ply, write_ply_points and an ASCII file; transforms: nerfstudio, instant-ngp and Blender
// JSON naming the fixture images; colmap: the COLMAP fixture as text and binary; image: PNG and
// JPEG). launch/fuzz and the fuzz_replay CTest tests run it first; see docs/testing.md.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/data/synth.h"
#include "framework/family.h"
#include "framework/snapshot.h"
#include "models/builtin.h"
#include "models/gaussians/gaussian_params.h"
#include "models/gaussians/ply.h"
#include "tests/fuzz/fuzz_fixtures.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace tessera;
using nlohmann::json;

void write_seed(const fs::path& out, const std::string& target, const std::string& name,
                const std::string& bytes) {
  test::write_text((out / target / name).string(), bytes);
}

std::string joined(const std::vector<std::string>& files) {
  std::string all;
  for (size_t i = 0; i < files.size(); ++i) all += (i ? fuzz::kFileSeparator : "") + files[i];
  return all;
}

void config_seeds(const fs::path& out, const fs::path& source) {
  std::vector<fs::path> configs;
  for (const auto& entry : fs::directory_iterator(source / "configs"))
    if (entry.path().extension() == ".toml") configs.push_back(entry.path());
  std::sort(configs.begin(), configs.end());
  for (const fs::path& config : configs) {
    const std::string text = test::read_file(config);
    write_seed(out, "config", config.stem().string() + ".toml", text);
    write_seed(out, "config", config.stem().string() + "-set.toml",
               text + fuzz::kFileSeparator + "train.steps=3\nrun.seed=7\nsnapshot.every=2");
  }
  // A config written back by to_toml, as a snapshot stores it.
  write_seed(out, "config", "written-back.toml", to_toml(load_config((source / "configs/demo_nerf.toml").string())));
}

void scene_seeds(const fs::path& out, const fs::path& work) {
  for (const std::string& preset : data::synth::preset_names()) {
    data::synth::SynthOptions options;
    options.preset = preset;
    options.views = 3;
    options.width = 12;
    options.height = 8;  // the smallest synth allows
    const std::string path = (work / (preset + ".h5")).string();
    data::synth::write_synth_scene(options, path);
    write_seed(out, "scene", "synth-" + preset + ".h5", test::read_file(path));
  }
  // Imported from COLMAP: images of two sizes (one dataset per image), points, distortion.
  const fs::path colmap = work / "colmap-scene";
  test::write_colmap_binary((colmap / "sparse/0").string(), fuzz::write_colmap_assets(colmap.string()));
  const std::string path = (work / "colmap.h5").string();
  data::write_scene(data::read_source(colmap.string()), path);
  write_seed(out, "scene", "imported-colmap.h5", test::read_file(path));
}

void snapshot_seeds(const fs::path& out, const fs::path& work, distributed::ProcessContext& context,
                    const fs::path& source) {
  SnapshotMeta meta;
  meta.step = 1;
  meta.model = "nerf-hash";
  meta.config_toml = to_toml(load_config((source / "configs/demo_nerf.toml").string()));
  meta.dataset_fingerprint = "fuzz-seed";
  const std::string path = snapshot_path(work.string(), 1);
  SnapshotWriter writer(context, path, meta);
  writer.write_replicated(snapshot_param("mlp/0.weight"), torch::randn({4, 3}));
  writer.write_replicated(snapshot_optimizer("mlp/0.weight", "exp_avg"), torch::zeros({4, 3}));
  writer.write_replicated(snapshot_state("step"), torch::tensor(int64_t{1}));
  writer.write_replicated(snapshot_state("mask"), torch::tensor({true, false, true}));
  writer.write_replicated(snapshot_state("bytes"), torch::arange(6, torch::kUInt8));
  writer.write_sharded(snapshot_param("gaussians/means"), torch::randn({5, 3}, torch::kFloat64));
  writer.write_sharded(snapshot_state("ids"), torch::arange(5, torch::kInt32));
  writer.commit();
  write_seed(out, "snapshot", "step-00000001.h5", test::read_file(path));
}

void ply_seeds(const fs::path& out, const fs::path& work) {
  const int64_t n = 4;
  const auto params = models::gaussians::make_params(
      torch::randn({n, 3}), torch::randn({n, 3}), torch::randn({n, 4}), torch::randn({n}),
      torch::randn({n, 1, 3}), torch::randn({n, 15, 3}));
  models::gaussians::write_ply((work / "gaussians.ply").string(), params);
  write_seed(out, "ply", "gaussians.ply", test::read_file(work / "gaussians.ply"));
  const auto xyz = torch::randn({5, 3}, torch::kFloat64);
  const auto rgb = torch::randint(0, 256, {5, 3}).to(torch::kUInt8);
  data::write_ply_points((work / "points-double.ply").string(), xyz, rgb);
  data::write_ply_points((work / "points-float.ply").string(), xyz.to(torch::kFloat32), rgb);
  write_seed(out, "ply", "points-double.ply", test::read_file(work / "points-double.ply"));
  write_seed(out, "ply", "points-float.ply", test::read_file(work / "points-float.ply"));
  write_seed(out, "ply", "points-ascii.ply",
             "ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\n"
             "property float z\nproperty uchar red\nproperty uchar green\nproperty uchar blue\n"
             "end_header\n0 0 0 255 0 0\n1 2 3 0 255 0\n");
}

void transforms_seeds(const fs::path& out) {
  json nerfstudio = {{"camera_model", "OPENCV"}, {"fl_x", 14.0}, {"fl_y", 15.0}, {"cx", 8.0},
                     {"cy", 6.0}, {"w", test::kFixtureWidth}, {"h", test::kFixtureHeight},
                     {"k1", 0.01}, {"k2", -0.02}, {"p1", 0.001}, {"p2", 0.0},
                     {"ply_file_path", "points3D.ply"}};
  json ngp = {{"camera_angle_x", 0.9}, {"aabb_scale", 4}, {"scale", 0.5},
              {"offset", {0.5, 0.5, 0.5}}};
  json blender = {{"camera_angle_x", 0.8}};
  json frames = json::array(), ngp_frames = json::array(), blender_frames = json::array();
  for (int i = 0; i < fuzz::kTransformsImages; ++i) {
    const double a = 2 * M_PI * i / fuzz::kTransformsImages;
    const auto pose = test::matrix_json(test::look_at_gl({4 * std::cos(a), 0.5, 4 * std::sin(a)}, {0, 0, 0}));
    frames.push_back({{"file_path", fuzz::transforms_image_name(i)}, {"transform_matrix", pose}});
    ngp_frames.push_back({{"file_path", fuzz::transforms_image_name(i)}, {"transform_matrix", pose}});
    if (i < 4) blender_frames.push_back({{"file_path", "images/" + std::to_string(i)}, {"transform_matrix", pose}});
  }
  frames[2].update({{"fl_x", 15.0}, {"cx", 8.5}});  // per-frame intrinsics
  nerfstudio["frames"] = frames;
  ngp["frames"] = ngp_frames;
  blender["frames"] = blender_frames;
  write_seed(out, "transforms", "nerfstudio.json", nerfstudio.dump(2));
  write_seed(out, "transforms", "instant-ngp.json", ngp.dump(2));
  write_seed(out, "transforms", "blender.json", blender.dump(2));
}

void colmap_seeds(const fs::path& out, const fs::path& work) {
  const test::ColmapFixture fixture = fuzz::write_colmap_assets((work / "colmap").string());
  test::write_colmap_text((work / "colmap/text").string(), fixture);
  test::write_colmap_binary((work / "colmap/bin").string(), fixture);
  for (const auto& [mode, ext] : {std::pair{"t", ".txt"}, std::pair{"b", ".bin"}}) {
    const fs::path dir = work / "colmap" / (std::string(mode) == "t" ? "text" : "bin");
    std::vector<std::string> files;
    for (const char* name : {"cameras", "images", "points3D"}) files.push_back(test::read_file(dir / (std::string(name) + ext)));
    write_seed(out, "colmap", std::string("model") + ext, mode + joined(files));
    files.pop_back();  // no points3D
    write_seed(out, "colmap", std::string("model-no-points") + ext, mode + joined(files));
  }
}

void image_seeds(const fs::path& out, const fs::path& work) {
  fuzz::write_transforms_assets((work / "assets").string());
  for (int i = 0; i < fuzz::kTransformsImages; ++i) {
    const std::string name = fuzz::transforms_image_name(i);
    write_seed(out, "image", fs::path(name).filename().string(), test::read_file(work / "assets" / name));
  }
  const auto grey = test::pattern(5, 7, 1, 1);
  stbi_write_png((work / "grey.png").c_str(), 5, 7, 1, grey.data_ptr<uint8_t>(), 5);
  const auto grey_alpha = test::pattern(5, 7, 2, 2);
  stbi_write_png((work / "grey-alpha.png").c_str(), 5, 7, 2, grey_alpha.data_ptr<uint8_t>(), 10);
  write_seed(out, "image", "grey.png", test::read_file(work / "grey.png"));
  write_seed(out, "image", "grey-alpha.png", test::read_file(work / "grey-alpha.png"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: write_seeds OUT_DIR SOURCE_DIR\n");
    return 2;
  }
  distributed::ProcessContext context(&argc, &argv, 120.0);
  try {
    const fs::path out = argv[1], source = argv[2], work = out / ".work";
    fs::remove_all(work);
    fs::create_directories(work);
    FamilyRegistry families;
    models::register_builtin_families(families);
    torch::manual_seed(0);
    config_seeds(out, source);
    scene_seeds(out, work);
    snapshot_seeds(out, work, context, source);
    ply_seeds(out, work);
    transforms_seeds(out);
    colmap_seeds(out, work);
    image_seeds(out, work);
    fs::remove_all(work);
    std::printf("seeds written to %s\n", out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
