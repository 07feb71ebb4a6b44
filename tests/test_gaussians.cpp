// Tests of the 3DGS building blocks (models/gaussians): PLY layout and round trip, exact kNN init,
// rendering, gradients, the L1 + SSIM loss, densification with Adam-state surgery, and a small fit.
#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <unistd.h>

#include <numeric>
#include <set>
#include <limits>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "framework/metrics.h"
#include "kernels/separable_blur.h"
#include "models/gaussians/densify.h"
#include "models/gaussians/gaussian_loss.h"
#include "models/gaussians/gaussian_params.h"
#include "models/gaussians/gaussian_render.h"
#include "models/gaussians/ply.h"
#include "models/gaussians/stereo_init.h"
#include "tests/test_util.h"

namespace {

namespace gs = tessera::models::gaussians;
namespace data = tessera::data;

// A fresh temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tessera-gs-XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() { tessera::test::remove_tree(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

gs::GaussianParams random_params(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return gs::make_params(torch::randn({n, 3}), torch::randn({n, 3}) - 3, torch::randn({n, 4}),
                         torch::randn({n}), torch::randn({n, 1, 3}), torch::randn({n, 15, 3}));
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         (a.nbytes() == 0 ||  // an empty tensor's data pointer may be null: no memcmp then
          std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0);
}

// ---------------------------------------------------------------------------------------- PLY

TEST(GaussianPly, HeaderIsExactlyTheInriaLayout) {
  std::string want = "ply\nformat binary_little_endian 1.0\nelement vertex 3\n";
  for (const char* p : {"x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"})
    want += std::string("property float ") + p + "\n";
  for (int i = 0; i < 45; ++i) want += "property float f_rest_" + std::to_string(i) + "\n";
  want += "property float opacity\n";
  for (int i = 0; i < 3; ++i) want += "property float scale_" + std::to_string(i) + "\n";
  for (int i = 0; i < 4; ++i) want += "property float rot_" + std::to_string(i) + "\n";
  want += "end_header\n";
  EXPECT_EQ(gs::ply_header(3), want);
  TempDir dir;
  gs::write_ply(dir.file("a.ply"), random_params(3, 1));
  const std::string bytes = tessera::test::read_file(dir.file("a.ply"));
  ASSERT_EQ(bytes.size(), want.size() + 3 * 62 * 4);
  EXPECT_EQ(bytes.substr(0, want.size()), want);
  // No temporary file is left behind.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.file(""))) ++entries, (void)e;
  EXPECT_EQ(entries, 1);
}

TEST(GaussianPly, RoundTripIsByteExact) {
  TempDir dir;
  for (int64_t n : {0, 1, 257}) {
    const gs::GaussianParams p = random_params(n, 7 + n);
    gs::write_ply(dir.file("a.ply"), p);
    const gs::GaussianParams q = gs::read_ply(dir.file("a.ply"));
    gs::write_ply(dir.file("b.ply"), q);
    EXPECT_EQ(tessera::test::read_file(dir.file("a.ply")),
              tessera::test::read_file(dir.file("b.ply")));
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_TRUE(bitwise_equal(*p.fields()[i], *q.fields()[i])) << gs::kGroupNames[i];
      EXPECT_TRUE(q.fields()[i]->requires_grad() && q.fields()[i]->is_leaf());
    }
  }
}

TEST(GaussianPly, FRestIsChannelMajor) {
  gs::GaussianParams p = random_params(2, 3);
  {
    torch::NoGradGuard ng;
    for (int64_t k = 0; k < 15; ++k)
      for (int64_t c = 0; c < 3; ++c) p.sh_rest.index_put_({1, k, c}, 100.0f * c + k);
  }
  TempDir dir;
  gs::write_ply(dir.file("a.ply"), p);
  const std::string bytes = tessera::test::read_file(dir.file("a.ply"));
  const size_t row1 = gs::ply_header(2).size() + 62 * 4;
  for (int j = 0; j < 45; ++j) {
    float v;
    std::memcpy(&v, bytes.data() + row1 + (9 + j) * 4, 4);
    EXPECT_EQ(v, 100.0f * (j / 15) + (j % 15)) << "f_rest_" << j;
  }
  // Normals are zero, values are stored before activation.
  float nx, op, s0, r0;
  std::memcpy(&nx, bytes.data() + row1 + 3 * 4, 4);
  std::memcpy(&op, bytes.data() + row1 + 54 * 4, 4);
  std::memcpy(&s0, bytes.data() + row1 + 55 * 4, 4);
  std::memcpy(&r0, bytes.data() + row1 + 58 * 4, 4);
  EXPECT_EQ(nx, 0.0f);
  EXPECT_EQ(op, p.opacity_logits[1].item<float>());
  EXPECT_EQ(s0, p.log_scales[1][0].item<float>());
  EXPECT_EQ(r0, p.quats[1][0].item<float>());
}

// A hand-written degree-1 file (9 f_rest, properties in another order, no normals).
TEST(GaussianPly, ImportsLowerDegreeAndPads) {
  std::vector<std::string> names = {"opacity", "x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2"};
  for (int i = 0; i < 9; ++i) names.push_back("f_rest_" + std::to_string(i));
  for (const char* s : {"scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"})
    names.push_back(s);
  std::string text = "ply\nformat binary_little_endian 1.0\ncomment made by hand\nelement vertex 1\n";
  for (const auto& n : names) text += "property float " + n + "\n";
  text += "end_header\n";
  std::vector<float> v(names.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);  // value = column
  text.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  TempDir dir;
  write_bytes(dir.file("d1.ply"), text);
  const gs::GaussianParams p = gs::read_ply(dir.file("d1.ply"));
  EXPECT_EQ(p.opacity_logits[0].item<float>(), 0.0f);
  EXPECT_EQ(p.means[0][2].item<float>(), 3.0f);
  EXPECT_EQ(p.sh_dc[0][0][1].item<float>(), 5.0f);
  // f_rest_j is column 7 + j; channel c, coefficient k (k < 3) is f_rest_{3c + k}.
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < 15; ++k)
      EXPECT_EQ(p.sh_rest[0][k][c].item<float>(), k < 3 ? 7.0f + 3 * c + k : 0.0f) << c << "," << k;
  EXPECT_EQ(p.quats[0][3].item<float>(), 22.0f);
}

TEST(GaussianPly, RejectsMalformedFiles) {
  TempDir dir;
  gs::write_ply(dir.file("good.ply"), random_params(2, 5));
  const std::string good = tessera::test::read_file(dir.file("good.ply"));
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not a ply"},
      {"hello\n", "not a ply"},
      {replace("binary_little_endian", "ascii"), "is not binary_little_endian"},
      {replace("binary_little_endian", "binary_big_endian"), "is not binary_little_endian"},
      {replace("property float opacity", "property uchar opacity"), "not float"},
      {replace("property float opacity\n", ""), "bytes"},  // size no longer matches
      {replace("property float opacity", "property float opacityx"), "missing property 'opacity'"},
      {replace("property float f_rest_44", "property float f_rest_45"), "numbered"},
      {replace("element vertex 2", "element vertex two"), "not a non-negative integer"},
      {replace("element vertex 2", "element vertex 3"), "truncated"},
      {good.substr(0, good.size() - 4), "truncated"},
      {good + "xx", "trailing"},
      {replace("end_header\n", "element face 0\nproperty list uchar int vertex_indices\nend_header\n"),
       "only one element"},
      {good.substr(0, 200), "before end_header"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    write_bytes(dir.file("bad.ply"), cases[i].first);
    try {
      gs::read_ply(dir.file("bad.ply"));
      ADD_FAILURE() << "case " << i << " was accepted";
    } catch (const tessera::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(cases[i].second), std::string::npos)
          << "case " << i << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(dir.file("bad.ply")), std::string::npos);
    }
  }
  // A degree-2-sized f_rest that is not 0/9/24/45.
  std::string s = good;
  for (int i = 44; i >= 40; --i) {
    const std::string line = "property float f_rest_" + std::to_string(i) + "\n";
    s.erase(s.find(line), line.size());
  }
  write_bytes(dir.file("bad.ply"), s);
  EXPECT_THROW(gs::read_ply(dir.file("bad.ply")), tessera::UserError);
  EXPECT_THROW(gs::read_ply(dir.file("missing.ply")), tessera::UserError);
}

// ---------------------------------------------------------------------------------- kNN, init

// Brute force: every other point, float64 distances from the float32 coordinates.
std::vector<double> brute_force_knn(const torch::Tensor& pts, int64_t i, int k) {
  const float* p = pts.data_ptr<float>();
  const int64_t n = pts.size(0);
  std::vector<double> d;
  d.reserve(n);
  for (int64_t j = 0; j < n; ++j) {
    if (j == i) continue;
    const double dx = static_cast<double>(p[j * 3]) - p[i * 3];
    const double dy = static_cast<double>(p[j * 3 + 1]) - p[i * 3 + 1];
    const double dz = static_cast<double>(p[j * 3 + 2]) - p[i * 3 + 2];
    d.push_back(dx * dx + dy * dy + dz * dz);
  }
  std::partial_sort(d.begin(), d.begin() + std::min<int64_t>(k, d.size()), d.end());
  d.resize(std::min<int64_t>(k, d.size()));
  return d;
}

void expect_knn_exact(const torch::Tensor& pts, int k, const std::string& what) {
  const gs::KnnResult r = gs::knn(pts, k);
  int64_t wrong = 0;
  for (int64_t i = 0; i < pts.size(0); ++i) {
    const std::vector<double> want = brute_force_knn(pts, i, k);
    for (int s = 0; s < k; ++s) {
      const double got = r.dist2[i][s].item<double>();
      const double ref = s < static_cast<int>(want.size()) ? want[s] : INFINITY;
      if (got != ref) ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << what;
}

TEST(GaussianInit, KnnMatchesBruteForce) {
  torch::manual_seed(11);
  expect_knn_exact(torch::rand({2000, 3}) * 4 - 2, 3, "uniform");
  // Clustered, with duplicates, a flat sheet and far outliers.
  torch::Tensor mixed = torch::cat({torch::randn({800, 3}) * 0.01, torch::randn({400, 3}) * 3,
                                    torch::rand({600, 3}) * torch::tensor({5.0f, 5.0f, 0.0f}),
                                    torch::zeros({5, 3}), torch::tensor({{100.f, -50.f, 7.f}})});
  expect_knn_exact(mixed, 3, "mixed");
  expect_knn_exact(torch::rand({50, 3}), 7, "k = 7");
  expect_knn_exact(torch::rand({3, 3}), 3, "fewer points than k + 1");
  EXPECT_EQ(gs::knn(torch::zeros({0, 3}), 3).dist2.size(0), 0);
}

TEST(GaussianInit, KnnOneMillionPoints) {
  torch::manual_seed(12);
  const torch::Tensor pts = torch::rand({1000000, 3}) * 10;
  const auto t0 = std::chrono::steady_clock::now();
  const gs::KnnResult r = gs::knn(pts, 3);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ timing ] knn k=3 on 1M points: %.3f s (%d threads)\n", seconds,
              at::get_num_threads());
  // Spot-check 20 points against brute force over the million.
  for (int64_t i = 0; i < 1000000; i += 50000) {
    const std::vector<double> want = brute_force_knn(pts, i, 3);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(r.dist2[i][s].item<double>(), want[s]) << i;
  }
}

TEST(GaussianInit, FromPointsAndRandom) {
  torch::manual_seed(13);
  const torch::Tensor xyz = torch::rand({500, 3});
  const torch::Tensor rgb = torch::randint(0, 256, {500, 3}).to(torch::kUInt8);
  const gs::GaussianParams p = gs::init_from_points(xyz, rgb, {0, 0, 0, 1, 1, 1}, {});
  EXPECT_TRUE(torch::equal(p.means, xyz));
  EXPECT_TRUE(torch::allclose(p.sh_dc.squeeze(1) * gs::kShC0 + 0.5, rgb.to(torch::kFloat32) / 255,
                              1e-6, 1e-6));
  EXPECT_EQ(p.sh_rest.abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(p.quats, torch::tensor({1.f, 0.f, 0.f, 0.f}).repeat({500, 1})));
  EXPECT_NEAR(p.opacities()[0].item<float>(), 0.1f, 1e-7);
  const torch::Tensor d2 = gs::knn(xyz, 3).dist2.mean(1);
  EXPECT_TRUE(torch::allclose(p.log_scales.select(1, 2), (0.5 * d2.log()).to(torch::kFloat32)));
  for (const torch::Tensor* t : p.fields()) EXPECT_TRUE(t->is_leaf() && t->requires_grad());
  EXPECT_EQ(p.parameter_groups().size(), 6u);
  EXPECT_EQ(p.parameter_groups()[3].name, "opacities");

  gs::InitOptions o;
  o.random_count = 300;
  o.seed = 4;
  const std::array<double, 6> b = {-1, -2, -3, 1, 2, 3};
  const gs::GaussianParams r1 = gs::init_from_points({}, {}, b, o);
  const gs::GaussianParams r2 = gs::init_from_points({}, {}, b, o);
  o.seed = 5;
  const gs::GaussianParams r3 = gs::init_from_points({}, {}, b, o);
  EXPECT_EQ(r1.size(), 300);
  EXPECT_TRUE(torch::equal(r1.means, r2.means) && torch::equal(r1.sh_dc, r2.sh_dc));
  EXPECT_FALSE(torch::equal(r1.means, r3.means));
  for (int a = 0; a < 3; ++a) {
    EXPECT_GE(r1.means.select(1, a).min().item<float>(), b[a]);
    EXPECT_LE(r1.means.select(1, a).max().item<float>(), b[a + 3]);
  }
}

// Unbounded scenes: half of the random Gaussians fill the space between the bounds and the
// extent, ever sparser outward (uniform in contracted space), none beyond the extent, and the
// ones in the bounds are exactly those of a bounded init.
TEST(GaussianInit, RandomInitOfAnUnboundedSceneReachesTheExtent) {
  gs::InitOptions o;
  o.random_count = 4000;
  o.seed = 9;
  const std::array<double, 6> b = {-1, -1, -1, 1, 1, 1};
  const gs::GaussianParams bounded = gs::init_from_points({}, {}, b, o);
  o.extent = std::array<double, 6>{-16, -16, -16, 16, 16, 16};
  const gs::GaussianParams p = gs::init_from_points({}, {}, b, o);
  ASSERT_EQ(p.size(), 4000);
  const torch::Tensor reach = std::get<0>(p.means.abs().max(1));  // |mean|_inf
  const torch::Tensor outside = reach > 1.0f;
  const double share = outside.to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(share, 0.5, 0.05) << "kBackgroundShare of them between the bounds and the extent";
  EXPECT_LE(reach.max().item<float>(), 16.0f + 1e-3f);
  EXPECT_GT(reach.max().item<float>(), 8.0f) << "the shell reaches far out";
  // Uniform in contracted space: the contracted radius r = 2 - 1/|p| is uniform in volume over
  // (1, 2 - 1/16], so |p| < 2.3 (r < 1.565) holds (1.565^3 - 1) / (1.9375^3 - 1) = 45% of the
  // shell; a fill uniform in world space would put under 1% there.
  const torch::Tensor shell = reach.masked_select(outside);
  const double inner = (shell < 2.3f).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(inner, 0.452, 0.05);
  // Rows that stayed in the bounds are the bounded init's rows.
  const torch::Tensor inside = outside.logical_not();
  EXPECT_TRUE(torch::equal(p.means.index({inside}), bounded.means.index({inside})));
  const gs::GaussianParams again = gs::init_from_points({}, {}, b, o);
  EXPECT_TRUE(torch::equal(p.means, again.means));
}

// Each rank builds only its slice of the initial set (from points, at random, or from a PLY):
// the slices of 3 parts, concatenated, are the whole set bit for bit.
TEST(GaussianInit, SlicesConcatenateToTheWholeSet) {
  torch::manual_seed(21);
  const torch::Tensor xyz = torch::rand({301, 3});
  const torch::Tensor rgb = torch::randint(0, 256, {301, 3}).to(torch::kUInt8);
  gs::InitOptions random;
  random.random_count = 202;
  random.seed = 9;
  TempDir dir;
  gs::write_ply(dir.file("whole.ply"), random_params(257, 3));
  for (int source = 0; source < 3; ++source) {
    auto build = [&](int64_t part, int64_t parts, int64_t* total) {
      gs::InitOptions o = source == 1 ? random : gs::InitOptions{};
      o.part = part;
      o.parts = parts;
      if (source == 2) return gs::read_ply(dir.file("whole.ply"), torch::kCPU, part, parts, total);
      return source == 0 ? gs::init_from_points(xyz, rgb, {0, 0, 0, 1, 1, 1}, o, torch::kCPU, total)
                         : gs::init_from_points({}, {}, {-1, -1, -1, 1, 1, 1}, o, torch::kCPU, total);
    };
    int64_t whole_n = 0;
    const gs::GaussianParams whole = build(0, 1, &whole_n);
    EXPECT_EQ(whole_n, whole.size());
    std::vector<gs::GaussianParams> parts;
    for (int64_t part = 0; part < 3; ++part) {
      int64_t n = -1;
      parts.push_back(build(part, 3, &n));
      EXPECT_EQ(n, whole_n) << source;
      EXPECT_EQ(parts.back().size(), tessera::even_slice(whole_n, part, 3).second -
                                         tessera::even_slice(whole_n, part, 3).first);
    }
    for (size_t f = 0; f < 6; ++f) {
      std::vector<torch::Tensor> pieces;
      for (const auto& p : parts) pieces.push_back(p.fields()[f]->detach());
      EXPECT_TRUE(bitwise_equal(torch::cat(pieces), whole.fields()[f]->detach()))
          << "source " << source << ", " << gs::kGroupNames[f];
    }
  }
}

TEST(GaussianParamsTest, LearningRates) {
  gs::LearningRates lr;
  EXPECT_DOUBLE_EQ(gs::means_learning_rate(lr, 2.0, 0), 3.2e-4);
  EXPECT_NEAR(gs::means_learning_rate(lr, 2.0, 30000), 3.2e-6, 1e-18);
  EXPECT_NEAR(gs::means_learning_rate(lr, 2.0, 15000), 2.0 * 1.6e-5, 1e-15);  // geometric mean
  EXPECT_NEAR(gs::means_learning_rate(lr, 2.0, 90000), 3.2e-6, 1e-18);
  gs::GaussianParams p = random_params(4, 1);
  auto adam = gs::make_optimizer(p, lr, 2.0);
  ASSERT_EQ(adam->param_groups().size(), 6u);
  gs::set_learning_rates(*adam, p, lr, 2.0, 30000);
  const double want[6] = {3.2e-6, 5e-3, 1e-3, 5e-2, 2.5e-3, 1.25e-4};
  for (int i = 0; i < 6; ++i) {
    const auto& g = adam->param_groups()[i];
    EXPECT_TRUE(g.params()[0].is_same(*p.fields()[i]));
    EXPECT_NEAR(static_cast<const torch::optim::AdamOptions&>(g.options()).lr(), want[i], 1e-15);
    EXPECT_EQ(static_cast<const torch::optim::AdamOptions&>(g.options()).eps(), 1e-15);
  }
}

// ---------------------------------------------------------------------------------- render

// A camera at `eye` with a rotation about z then x, fx = fy = 50, 64 x 48.
data::Camera test_camera() {
  data::Camera cam;
  cam.fx = cam.fy = 50;
  cam.cx = 32;
  cam.cy = 24;
  cam.width = 64;
  cam.height = 48;
  const double a = 0.3, b = -0.5;
  const double rz[9] = {std::cos(a), -std::sin(a), 0, std::sin(a), std::cos(a), 0, 0, 0, 1};
  const double rx[9] = {1, 0, 0, 0, std::cos(b), -std::sin(b), 0, std::sin(b), std::cos(b)};
  const double t[3] = {1.0, 2.0, -3.0};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      double s = 0;
      for (int k = 0; k < 3; ++k) s += rz[r * 3 + k] * rx[k * 3 + c];
      cam.camera_to_world[r * 4 + c] = s;
    }
    cam.camera_to_world[r * 4 + 3] = t[r];
  }
  return cam;
}

torch::Tensor camera_to_world_point(const data::Camera& cam, const double p[3]) {
  std::vector<float> w(3);
  for (int r = 0; r < 3; ++r) {
    double s = cam.camera_to_world[r * 4 + 3];
    for (int c = 0; c < 3; ++c) s += cam.camera_to_world[r * 4 + c] * p[c];
    w[r] = static_cast<float>(s);
  }
  return torch::tensor(w).view({1, 3});
}

TEST(GaussianRender, SingleGaussianLandsOnTheProjectedPixel) {
  const data::Camera cam = test_camera();
  const double pc[3] = {0.21, -0.09, 2.0};  // camera space: u = 37.25, v = 21.75
  const float colour[3] = {0.9f, 0.2f, 0.4f};
  torch::Tensor dc = torch::empty({1, 1, 3});
  for (int c = 0; c < 3; ++c) dc[0][0][c] = (colour[c] - 0.5) / gs::kShC0;
  const gs::GaussianParams p = gs::make_params(
      camera_to_world_point(cam, pc), torch::full({1, 3}, std::log(0.01f)),
      torch::tensor({{0.3f, 0.1f, -0.2f, 0.5f}}), torch::full({1}, 8.0f), dc,
      torch::zeros({1, 15, 3}));
  gs::RenderOptions o;
  o.background = torch::tensor({0.0f, 0.5f, 1.0f});
  for (double downscale : {1.0, 2.0}) {
    const gs::RenderCamera rc = gs::make_render_camera(cam, downscale);
    const gs::RenderOutput out = gs::render_gaussians(p, rc, o);
    ASSERT_EQ(out.image.sizes(), (std::vector<int64_t>{48 / (int)downscale, 64 / (int)downscale, 3}));
    EXPECT_NEAR(out.means2d[0][0].item<float>(), 37.25 / downscale, 1e-4);
    EXPECT_NEAR(out.means2d[0][1].item<float>(), 21.75 / downscale, 1e-4);
    EXPECT_NEAR(out.depths[0].item<float>(), 2.0, 1e-5);
    EXPECT_GT(out.radii[0].item<int>(), 0);
    const int64_t best = out.alphas.flatten().argmax().item<int64_t>();
    const int64_t w = out.image.size(1);
    EXPECT_EQ(best % w, static_cast<int64_t>(37.25 / downscale)) << downscale;
    EXPECT_EQ(best / w, static_cast<int64_t>(21.75 / downscale)) << downscale;
    const float a = out.alphas.flatten()[best].item<float>();
    EXPECT_GT(a, 0.5f);
    for (int c = 0; c < 3; ++c)
      EXPECT_NEAR(out.image.view({-1, 3})[best][c].item<float>(),
                  a * colour[c] + (1 - a) * o.background[c].item<float>(), 1e-5);
    // Far from the Gaussian: the background.
    EXPECT_TRUE(torch::allclose(out.image[0][0], o.background));
  }
  // A tile mask that excludes the Gaussian's tile leaves the background there.
  const gs::RenderCamera rc = gs::make_render_camera(cam);
  o.tile_mask = torch::ones({4 * 3}, torch::kBool);
  o.tile_mask[1 * 4 + 2] = false;  // tile (ty 1, tx 2) holds pixel (21, 37)
  const gs::RenderOutput masked = gs::render_gaussians(p, rc, o);
  EXPECT_TRUE(torch::allclose(masked.image[21][37], o.background));
}

TEST(GaussianRender, GradientsReachEveryGroup) {
  torch::manual_seed(3);
  const data::Camera cam = test_camera();
  const int n = 20;
  torch::Tensor pc = torch::rand({n, 3}) * torch::tensor({1.2f, 0.8f, 1.0f}) -
                     torch::tensor({0.6f, 0.4f, -2.0f});
  torch::Tensor world = torch::empty({n, 3});
  for (int i = 0; i < n; ++i) {
    const double q[3] = {pc[i][0].item<double>(), pc[i][1].item<double>(), pc[i][2].item<double>()};
    world[i] = camera_to_world_point(cam, q)[0];
  }
  const gs::GaussianParams p =
      gs::make_params(world, torch::full({n, 3}, -2.5f) + 0.3 * torch::randn({n, 3}),
                      torch::randn({n, 4}), torch::zeros({n}), torch::randn({n, 1, 3}) * 0.5,
                      torch::randn({n, 15, 3}) * 0.2);
  gs::RenderOptions o;
  o.sh_degree = 3;
  o.background = torch::tensor({1.0f, 1.0f, 1.0f});
  const gs::RenderOutput out = gs::render_gaussians(p, gs::make_render_camera(cam), o);
  const torch::Tensor target = torch::rand({48, 64, 3});
  gs::photometric_loss(out.image, target).backward();
  for (size_t i = 0; i < 6; ++i) {
    const torch::Tensor g = p.fields()[i]->grad();
    ASSERT_TRUE(g.defined()) << gs::kGroupNames[i];
    EXPECT_GT(g.abs().sum().item<double>(), 0.0) << gs::kGroupNames[i];
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << gs::kGroupNames[i];
  }
  ASSERT_TRUE(out.means2d.grad().defined());
  EXPECT_GT(out.means2d.grad().abs().sum().item<double>(), 0.0);
}

// ---------------------------------------------------------------------------------- loss

// SSIM with zero 'same' padding written out per pixel (float64), as the reference.
double naive_ssim(const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t h = a.size(0), w = a.size(1), ch = a.size(2);
  double g[11], gs_sum = 0;
  for (int i = 0; i < 11; ++i) gs_sum += g[i] = std::exp(-(i - 5) * (i - 5) / (2 * 1.5 * 1.5));
  for (double& v : g) v /= gs_sum;
  auto A = a.accessor<double, 3>();
  auto B = b.accessor<double, 3>();
  double total = 0;
  for (int64_t c = 0; c < ch; ++c)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        double ma = 0, mb = 0, saa = 0, sbb = 0, sab = 0;
        for (int dy = -5; dy <= 5; ++dy)
          for (int dx = -5; dx <= 5; ++dx) {
            const int64_t yy = y + dy, xx = x + dx;
            if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;  // zero padding
            const double wt = g[dy + 5] * g[dx + 5], va = A[yy][xx][c], vb = B[yy][xx][c];
            ma += wt * va;
            mb += wt * vb;
            saa += wt * va * va;
            sbb += wt * vb * vb;
            sab += wt * va * vb;
          }
        const double c1 = 1e-4, c2 = 9e-4;
        total += ((2 * ma * mb + c1) * (2 * (sab - ma * mb) + c2)) /
                 ((ma * ma + mb * mb + c1) * (saa - ma * ma + sbb - mb * mb + c2));
      }
  return total / (h * w * ch);
}

TEST(GaussianLoss, EqualsTheFormulaOnAHandExample) {
  torch::manual_seed(21);
  const torch::Tensor a = torch::rand({13, 17, 3}, torch::kFloat64);
  const torch::Tensor b = (a + 0.2 * torch::randn({13, 17, 3}, torch::kFloat64)).clamp(0, 1);
  const double ref_ssim = naive_ssim(a, b);
  EXPECT_NEAR(gs::ssim_same(a, b).item<double>(), ref_ssim, 1e-12);
  const double l1 = (a - b).abs().mean().item<double>();
  EXPECT_NEAR(gs::photometric_loss(a, b).item<double>(), 0.8 * l1 + 0.2 * (1 - ref_ssim), 1e-12);
  EXPECT_NEAR(gs::photometric_loss(a, a).item<double>(), 0.0, 1e-12);
  // float32 agrees.
  EXPECT_NEAR(gs::photometric_loss(a.to(torch::kFloat32), b.to(torch::kFloat32)).item<double>(),
              0.8 * l1 + 0.2 * (1 - ref_ssim), 1e-5);
}

TEST(GaussianLoss, SsimMatchesMetricsOnTheValidRegion) {
  torch::manual_seed(22);
  const torch::Tensor a = torch::rand({40, 37, 3}, torch::kFloat64);
  const torch::Tensor b = (0.7 * a + 0.3 * torch::rand({40, 37, 3}, torch::kFloat64));
  // Pixels at least 5 from every border see no padding: there the 'same' map is the 'valid' one.
  const torch::Tensor valid = gs::ssim_map(a, b).slice(0, 5, 35).slice(1, 5, 32);
  EXPECT_NEAR(valid.mean().item<double>(), tessera::ssim(a, b), 1e-6);
}

TEST(GaussianLoss, SsimIsDifferentiable) {
  torch::manual_seed(23);
  const torch::Tensor a = torch::rand({12, 12, 2}, torch::kFloat64).requires_grad_(true);
  const torch::Tensor b = torch::rand({12, 12, 2}, torch::kFloat64);
  gs::ssim_same(a, b).backward();
  const torch::Tensor g = a.grad();
  constexpr double kStep = 1e-6;  // central differences in float64
  for (int64_t idx : {0, 37, 100, 287}) {
    torch::NoGradGuard ng;
    torch::Tensor ap = a.detach().clone(), am = a.detach().clone();
    ap.view(-1)[idx] += kStep;
    am.view(-1)[idx] -= kStep;
    const double fd = (gs::ssim_same(ap, b) - gs::ssim_same(am, b)).item<double>() / (2 * kStep);
    EXPECT_NEAR(g.view(-1)[idx].item<double>(), fd, 1e-7) << idx;
  }
}

// The CPU blur equals two depthwise conv2d with zero 'same' padding, also for planes narrower or
// shorter than the window and for asymmetric windows (taps read offset i - L/2).
TEST(GaussianLoss, SeparableBlurMatchesConv2d) {
  torch::manual_seed(25);
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 1, 1}, {2, 3, 4}, {3, 40, 7}, {2, 9, 33}}) {
      for (const int64_t taps : {1, 3, 11}) {
        const torch::Tensor planes = torch::rand(shape, dtype);
        const torch::Tensor g = torch::rand({taps}, dtype);
        const int64_t k = shape[0], pad = taps / 2;
        const torch::Tensor v = torch::conv2d(
            planes.unsqueeze(0), g.view({1, 1, taps, 1}).expand({k, 1, taps, 1}).contiguous(),
            torch::Tensor(), torch::IntArrayRef{1, 1}, torch::IntArrayRef{pad, 0},
            torch::IntArrayRef{1, 1}, k);
        const torch::Tensor want = torch::conv2d(
            v, g.view({1, 1, 1, taps}).expand({k, 1, 1, taps}).contiguous(), torch::Tensor(),
            torch::IntArrayRef{1, 1}, torch::IntArrayRef{0, pad}, torch::IntArrayRef{1, 1}, k);
        const torch::Tensor got = tessera::kernels::separable_blur_cpu(planes, g);
        ASSERT_EQ(got.sizes(), planes.sizes());
        EXPECT_LE((got - want.squeeze(0)).abs().max().item<double>(),
                  dtype == torch::kFloat64 ? 1e-12 : 1e-5)
            << shape[0] << "x" << shape[1] << "x" << shape[2] << " taps " << taps;
      }
    }
  }
  EXPECT_THROW(tessera::kernels::separable_blur_cpu(torch::rand({2, 3}), torch::rand({3})),
               std::invalid_argument);
  EXPECT_THROW(tessera::kernels::separable_blur_cpu(torch::rand({1, 3, 3}), torch::rand({4})),
               std::invalid_argument);
  EXPECT_THROW(tessera::kernels::separable_blur_cpu(torch::rand({1, 3, 3}),
                                                    torch::rand({3}, torch::kFloat64)),
               std::invalid_argument);
}

// ssim_same's written-out backward equals autograd through ssim_map's graph, for both images
// (the target too, though training never asks for it), in float64 and float32.
TEST(GaussianLoss, SsimBackwardMatchesAutogradThroughTheMap) {
  torch::manual_seed(24);
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const torch::Tensor a0 = torch::rand({29, 23, 3}, dtype);
    const torch::Tensor b0 = (0.6 * a0 + 0.4 * torch::rand({29, 23, 3}, dtype)).to(dtype);
    torch::Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    (3.0 * gs::ssim_same(a, b)).backward();
    torch::Tensor ra = a0.clone().requires_grad_(true), rb = b0.clone().requires_grad_(true);
    (3.0 * gs::ssim_map(ra, rb).mean()).backward();
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
    EXPECT_NEAR(gs::ssim_same(a0, b0).item<double>(), gs::ssim_map(a0, b0).mean().item<double>(),
                tol);
    EXPECT_LE((a.grad() - ra.grad()).abs().max().item<double>(), tol) << dtype;
    EXPECT_LE((b.grad() - rb.grad()).abs().max().item<double>(), tol) << dtype;
    EXPECT_GT(ra.grad().abs().max().item<double>(), 1e-4) << "a gradient that says something";
    // Only the render asks: the target gets no gradient.
    torch::Tensor only = a0.clone().requires_grad_(true);
    gs::ssim_same(only, b0).backward();
    EXPECT_LE((only.grad() - ra.grad() / 3.0).abs().max().item<double>(), tol) << dtype;
  }
}

// ---------------------------------------------------------------------------------- densify

// Four Gaussians, extent 1 (percent_dense threshold 0.01): row 0 small + hot (clone), row 1 big +
// hot (split), row 2 faint (prune), row 3 small + cold (kept as is).
gs::GaussianParams densify_scene() {
  return gs::make_params(
      torch::tensor({{0.f, 0.f, 0.f}, {1.f, 0.f, 0.f}, {2.f, 0.f, 0.f}, {3.f, 0.f, 0.f}}),
      torch::log(torch::tensor({{0.005f, 0.005f, 0.005f},
                                {0.05f, 0.02f, 0.01f},
                                {0.005f, 0.005f, 0.005f},
                                {0.005f, 0.005f, 0.005f}})),
      torch::tensor({{1.f, 0.f, 0.f, 0.f}, {0.9f, 0.1f, 0.3f, -0.2f}, {1.f, 0.f, 0.f, 0.f},
                     {1.f, 0.f, 0.f, 0.f}}),
      torch::tensor({0.5f, 1.0f, -7.0f, 0.0f}), torch::randn({4, 1, 3}), torch::randn({4, 15, 3}));
}

gs::DensifyStats hot_stats() {
  gs::DensifyStats s;
  s.reset(4);
  s.grad_norm_sum = torch::tensor({9e-4f, 6e-4f, 0.f, 1e-4f});
  s.count = torch::tensor({3, 2, 1, 1}, torch::kInt32);  // means 3e-4, 3e-4, 0, 1e-4
  return s;
}

// Two Adam steps so that every param has state.
std::unique_ptr<torch::optim::Adam> stepped_adam(gs::GaussianParams& p) {
  auto adam = gs::make_optimizer(p, {}, 1.0);
  for (int s = 0; s < 2; ++s) {
    adam->zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (torch::Tensor* t : p.fields()) loss = loss + (t->pow(2) * (1 + torch::arange(t->numel()).view(t->sizes()))).sum();
    loss.backward();
    adam->step();
  }
  return adam;
}

const torch::optim::AdamParamState& state_of(torch::optim::Adam& adam, const torch::Tensor& t) {
  return static_cast<const torch::optim::AdamParamState&>(*adam.state().at(t.unsafeGetTensorImpl()));
}

TEST(GaussianDensify, CloneSplitPruneWithAdamSurgery) {
  torch::manual_seed(31);
  gs::GaussianParams p = densify_scene();
  auto adam = stepped_adam(p);
  std::vector<torch::Tensor> old_params, old_avg, old_sq;
  for (torch::Tensor* t : p.fields()) {
    old_params.push_back(t->detach().clone());
    old_avg.push_back(state_of(*adam, *t).exp_avg().clone());
    old_sq.push_back(state_of(*adam, *t).exp_avg_sq().clone());
  }
  gs::DensifyStats stats = hot_stats();
  gs::DensifyOptions o;
  const gs::DensifyResult r = gs::densify_and_prune(p, adam.get(), stats, o, 1.0, 600);
  EXPECT_EQ(r.cloned, 1);
  EXPECT_EQ(r.split, 1);
  EXPECT_EQ(r.pruned, 1);
  EXPECT_EQ(r.before, 4);
  // Rows: originals 0 and 3, the clone of 0, the two children of 1.
  ASSERT_EQ(p.size(), 5);
  EXPECT_EQ(r.after, 5);
  const std::vector<int64_t> kept = {0, 3};
  for (size_t f = 0; f < 6; ++f) {
    const torch::Tensor& t = *p.fields()[f];
    EXPECT_TRUE(t.is_leaf() && t.requires_grad());
    // The optimizer holds the new tensor, and its state rows moved with it.
    EXPECT_TRUE(adam->param_groups()[f].params()[0].is_same(t)) << gs::kGroupNames[f];
    const auto& st = state_of(*adam, t);
    EXPECT_EQ(st.step(), 2);
    for (size_t k = 0; k < kept.size(); ++k) {
      EXPECT_TRUE(bitwise_equal(t[k].detach(), old_params[f][kept[k]]));
      EXPECT_TRUE(bitwise_equal(st.exp_avg()[k], old_avg[f][kept[k]])) << gs::kGroupNames[f];
      EXPECT_TRUE(bitwise_equal(st.exp_avg_sq()[k], old_sq[f][kept[k]])) << gs::kGroupNames[f];
    }
    for (int64_t k = 2; k < 5; ++k) {
      EXPECT_EQ(st.exp_avg()[k].abs().sum().item<float>(), 0.0f);
      EXPECT_EQ(st.exp_avg_sq()[k].abs().sum().item<float>(), 0.0f);
    }
    EXPECT_EQ(adam->state().size(), 6u);
  }
  // The clone is an exact copy of row 0.
  for (size_t f = 0; f < 6; ++f)
    EXPECT_TRUE(bitwise_equal(p.fields()[f]->detach()[2], old_params[f][0])) << gs::kGroupNames[f];
  // Children: scale / 1.6, everything but the mean copied, means spread around the parent.
  for (int64_t c : {3, 4}) {
    EXPECT_TRUE(torch::allclose(p.scales()[c], old_params[1][1].exp() / 1.6));
    EXPECT_TRUE(bitwise_equal(p.quats.detach()[c], old_params[2][1]));
    EXPECT_TRUE(bitwise_equal(p.sh_rest.detach()[c], old_params[5][1]));
    EXPECT_LT((p.means[c] - old_params[0][1]).norm().item<float>(), 0.05f * 5);
  }
  EXPECT_FALSE(torch::equal(p.means[3], p.means[4]));
  EXPECT_EQ(stats.count.size(0), 5);
  EXPECT_EQ(stats.count.sum().item<int>(), 0);
  // The optimizer keeps working on the new tensors.
  adam->zero_grad();
  p.means.sum().backward();
  adam->step();
  EXPECT_EQ(state_of(*adam, p.means).step(), 3);
}

// The children are the same whatever the row order when the caller passes the canonical ids.
TEST(GaussianDensify, SplitSamplesFollowIdentityNotRow) {
  gs::DensifyOptions o;
  o.seed = 99;
  torch::manual_seed(32);
  gs::GaussianParams a = densify_scene();
  gs::DensifyStats sa = hot_stats();
  gs::densify_and_prune(a, nullptr, sa, o, 1.0, 700, torch::tensor({10, 11, 12, 13}));
  // Reversed rows with their ids.
  const torch::Tensor rev = torch::tensor({3, 2, 1, 0});
  gs::GaussianParams b = densify_scene();
  for (torch::Tensor* t : b.fields()) *t = t->detach().index_select(0, rev).requires_grad_(true);
  {
    torch::manual_seed(32);
    gs::GaussianParams fresh = densify_scene();  // same random SH as `a`
    for (size_t f = 0; f < 6; ++f)
      *b.fields()[f] = fresh.fields()[f]->detach().index_select(0, rev).requires_grad_(true);
  }
  gs::DensifyStats sb;
  sb.reset(4);
  sb.grad_norm_sum = hot_stats().grad_norm_sum.index_select(0, rev);
  sb.count = hot_stats().count.index_select(0, rev);
  gs::densify_and_prune(b, nullptr, sb, o, 1.0, 700, torch::tensor({13, 12, 11, 10}));
  // Both end with the two children of id 11 as the last two rows.
  EXPECT_TRUE(bitwise_equal(a.means.detach().slice(0, 3), b.means.detach().slice(0, 3)));
  // Another step or seed gives other children.
  gs::GaussianParams c = densify_scene();
  gs::DensifyStats sc = hot_stats();
  gs::densify_and_prune(c, nullptr, sc, o, 1.0, 800, torch::tensor({10, 11, 12, 13}));
  EXPECT_FALSE(torch::equal(a.means.slice(0, 3), c.means.slice(0, 3)));
}

TEST(GaussianDensify, PruneTooLargeOnlyAfterFirstReset) {
  gs::GaussianParams p = densify_scene();
  gs::DensifyOptions o;
  gs::DensifyStats s;
  s.reset(4);
  s.max_radii = torch::tensor({25, 0, 0, 0}, torch::kInt32);  // row 0 too large on screen
  gs::densify_and_prune(p, nullptr, s, o, 0.3, 1000);         // before the first reset: opacity only
  EXPECT_EQ(p.size(), 3);
  p = densify_scene();
  s.reset(4);
  s.max_radii = torch::tensor({25, 0, 0, 0}, torch::kInt32);
  // After it: row 0 (screen), row 1 (0.05 > 0.1 x 0.3 world) and row 2 (opacity) go.
  const gs::DensifyResult r = gs::densify_and_prune(p, nullptr, s, o, 0.3, 3100);
  EXPECT_EQ(r.pruned, 3);
  ASSERT_EQ(p.size(), 1);
  EXPECT_EQ(p.means[0][0].item<float>(), 3.0f);
}

TEST(GaussianDensify, OpacityResetAndSchedule) {
  gs::GaussianParams p = densify_scene();
  auto adam = stepped_adam(p);
  const torch::Tensor before = p.opacities().detach();
  const torch::Tensor old_means = p.means;
  gs::DensifyOptions o;
  gs::reset_opacity(p, adam.get(), o);
  const torch::Tensor after = p.opacities().detach();
  EXPECT_TRUE(torch::allclose(after, torch::minimum(before, torch::full_like(before, 0.01)), 0, 1e-7));
  EXPECT_NEAR(after[2].item<float>(), before[2].item<float>(), 1e-9);  // already below 0.01
  const auto& st = state_of(*adam, p.opacity_logits);
  EXPECT_EQ(st.step(), 2);
  EXPECT_EQ(st.exp_avg().abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(st.exp_avg_sq().abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(adam->param_groups()[3].params()[0].is_same(p.opacity_logits));
  EXPECT_TRUE(p.means.is_same(old_means));  // other groups untouched
  EXPECT_GT(state_of(*adam, p.means).exp_avg().abs().sum().item<float>(), 0.0f);

  EXPECT_FALSE(gs::densifies(o, 500));
  EXPECT_TRUE(gs::densifies(o, 600));
  EXPECT_FALSE(gs::densifies(o, 650));
  EXPECT_FALSE(gs::densifies(o, 15000));
  EXPECT_TRUE(gs::resets_opacity(o, 3000));
  EXPECT_FALSE(gs::resets_opacity(o, 3001));
  EXPECT_FALSE(gs::resets_opacity(o, 15000));
  EXPECT_TRUE(gs::accumulates_stats(o, 14999));
  EXPECT_FALSE(gs::accumulates_stats(o, 15000));
}

TEST(GaussianDensify, StatsAccumulateVisibleViewsOnly) {
  gs::DensifyStats s;
  s.reset(3);
  const torch::Tensor v = torch::tensor({{3e-4f, 4e-4f}, {1.f, 1.f}, {0.f, 2e-4f}});
  s.accumulate(torch::tensor({2, 0, 5}, torch::kInt32), v, 2, 4);  // scale (1, 2)
  s.accumulate(torch::tensor({4, 0, 1}, torch::kInt32), v, 2, 4);
  EXPECT_TRUE(torch::equal(s.count, torch::tensor({2, 0, 2}, torch::kInt32)));
  EXPECT_TRUE(torch::equal(s.max_radii, torch::tensor({4, 0, 5}, torch::kInt32)));
  const torch::Tensor m = s.mean_grad();
  EXPECT_NEAR(m[0].item<float>(), std::sqrt(3e-4 * 3e-4 + 8e-4 * 8e-4), 1e-9);
  EXPECT_EQ(m[1].item<float>(), 0.0f);
  EXPECT_NEAR(m[2].item<float>(), 4e-4, 1e-9);
  EXPECT_THROW(s.accumulate(torch::zeros({2}, torch::kInt32), v.slice(0, 0, 2), 2, 4),
               std::invalid_argument);
}

// ------------------------------------------------------------------------------- stereo

// Stereo's starting points on a synthetic scene whose surfaces are known exactly: their distance
// to the nearest surface (the shapes' signed distance functions), the colour of the pixel they
// came from against the surface's shading there, and the same set from any split over ranks.
void expect_stereo_on_surfaces(const std::string& preset) {
  SCOPED_TRACE(preset);
  TempDir dir;
  data::synth::SynthOptions so;
  so.preset = preset;
  so.views = 40;
  so.width = 96;
  so.height = 96;
  data::synth::write_synth_scene(so, dir.file("scene.h5"));
  data::SceneReader scene(dir.file("scene.h5"));
  const data::synth::SynthScene truth = data::synth::build_scene(so);
  std::vector<int64_t> views;
  for (size_t i : scene.indices(data::Split::Train)) views.push_back(static_cast<int64_t>(i));
  gs::StereoOptions o;
  o.points = 4000;
  const gs::StereoPoints all = gs::stereo_points(scene, views, o);
  const int64_t n = all.xyz.size(0);
  EXPECT_GT(n, o.points / 4) << "of " << all.candidates << " candidates in " << all.views << " views";
  EXPECT_LE(n, o.points + static_cast<int64_t>(views.size()));
  // Each point's distance to the nearest surface (the shapes' signed distance functions) in
  // pixel footprints at its distance from the nearest camera (a lower bound of the footprint in
  // the view it came from, so a strict measure).
  std::vector<double> err;
  const auto xyz = all.xyz.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const data::synth::Vec3 p{xyz[i][0], xyz[i][1], xyz[i][2]};
    double d = std::numeric_limits<double>::infinity();
    for (const auto& shape : truth.shapes) d = std::min(d, std::abs(data::synth::sdf_shape(shape, p)));
    double footprint = std::numeric_limits<double>::infinity();
    for (const auto& c : scene.cameras()) {
      const auto& m = c.camera_to_world;
      footprint = std::min(footprint, std::hypot(p.x - m[3], p.y - m[7], p.z - m[11]) / c.fx);
    }
    err.push_back(d / footprint);
  }
  std::sort(err.begin(), err.end());
  std::printf("%s: %lld points; distance to the surface in pixel footprints: median %.2f, "
              "85%% %.2f\n", preset.c_str(), static_cast<long long>(n), err[err.size() / 2],
              err[err.size() * 85 / 100]);
  // The median within about a footprint, 85% within a few (matching at half the resolution
  // fails both on both scenes).
  EXPECT_LT(err[err.size() / 2], 1.5);
  EXPECT_LT(err[err.size() * 85 / 100], 4.0);
  // Rank splits: each part's points are its views' points, in view order.
  for (int64_t parts : {2, 3}) {
    std::vector<torch::Tensor> xyz_parts, rgb_parts;
    for (int64_t r = 0; r < parts; ++r) {
      const gs::StereoPoints mine = gs::stereo_points(scene, views, o, r, parts);
      xyz_parts.push_back(mine.xyz);
      rgb_parts.push_back(mine.rgb);
    }
    EXPECT_TRUE(torch::equal(torch::cat(xyz_parts), all.xyz)) << parts << " parts";
    EXPECT_TRUE(torch::equal(torch::cat(rgb_parts), all.rgb)) << parts << " parts";
  }
}

TEST(StereoInit, PointsLieOnTheSurfacesOfAnObjectScene) { expect_stereo_on_surfaces("objects"); }
TEST(StereoInit, PointsLieOnTheSurfacesOfARoomSeenFromInside) { expect_stereo_on_surfaces("room"); }

TEST(StereoInit, SourcesLookTheSameWayFromAnotherPlace) {
  // A ring of cameras looking at the origin, 10 degrees apart, and one looking up.
  std::vector<data::Camera> cams;
  for (int k = 0; k < 36; ++k) {
    const double a = k * 10.0 * M_PI / 180.0;
    data::Camera c = data::synth::pinhole_camera(
        64, 64, 50.0, data::synth::look_at({3 * std::cos(a), 3 * std::sin(a), 0.5}, {0, 0, 0}));
    cams.push_back(c);
  }
  cams.push_back(data::synth::pinhole_camera(64, 64, 50.0, data::synth::look_at({3, 0, 0.5}, {3.1, 0, 10})));
  std::vector<int64_t> views(cams.size());
  std::iota(views.begin(), views.end(), 0);
  const std::vector<int64_t> s = gs::stereo_sources(cams, views, 0, {-1, -1, -1, 1, 1, 1}, 4);
  ASSERT_EQ(s.size(), 4u);
  // 10 degrees apart: the two next on the ring first, then the two at 20 degrees.
  EXPECT_EQ(std::set<int64_t>(s.begin(), s.begin() + 2), (std::set<int64_t>{1, 35}));
  EXPECT_EQ(std::set<int64_t>(s.begin() + 2, s.end()), (std::set<int64_t>{2, 34}));
  // The camera looking up is nobody's source, and has none.
  EXPECT_TRUE(gs::stereo_sources(cams, views, 36, {-1, -1, -1, 1, 1, 1}, 4).empty());
}

// ---------------------------------------------------------------------------------- fit

TEST(GaussianFit, TwoHundredStepsRaisePsnr) {
  TempDir dir;
  data::synth::SynthOptions so;
  so.preset = "objects";
  so.views = 10;
  so.width = 64;
  so.height = 64;
  data::synth::write_synth_scene(so, dir.file("scene.h5"));
  data::SceneReader scene(dir.file("scene.h5"));
  ASSERT_TRUE(scene.has_points());
  gs::GaussianParams p = gs::init_from_scene(scene, {});
  const double extent = gs::scene_extent(scene.cameras());
  gs::LearningRates rates;
  auto adam = gs::make_optimizer(p, rates, extent);
  gs::RenderOptions ro;
  const auto& bg = scene.meta().background;
  ro.background = torch::tensor({(float)bg[0], (float)bg[1], (float)bg[2]});
  ro.sh_degree = 1;
  // The recipe compressed into 200 steps, so that densification runs inside the fit.
  gs::DensifyOptions dopt;
  dopt.densify_from = 50;
  dopt.densify_every = 50;
  dopt.densify_until = 160;
  dopt.opacity_reset_every = 100000;
  gs::DensifyStats stats;
  stats.reset(p.size());

  const std::vector<size_t> train = scene.indices(data::Split::Train);
  std::vector<torch::Tensor> targets;
  for (size_t i : train) targets.push_back(scene.read_image(i).to(torch::kFloat32) / 255.0f);
  auto eval_psnr = [&](size_t k) {
    torch::NoGradGuard ng;
    const auto out = gs::render_gaussians(p, gs::make_render_camera(scene.cameras()[train[k]]), ro);
    return tessera::psnr(out.image, targets[k]);
  };
  const double before = eval_psnr(0);
  const int64_t start_count = p.size();
  for (int64_t step = 1; step <= 200; ++step) {
    const size_t k = static_cast<size_t>(step) % train.size();
    gs::set_learning_rates(*adam, p, rates, extent, step);
    adam->zero_grad();
    const auto out = gs::render_gaussians(p, gs::make_render_camera(scene.cameras()[train[k]]), ro);
    gs::photometric_loss(out.image, targets[k]).backward();
    adam->step();
    if (gs::accumulates_stats(dopt, step))
      stats.accumulate(out.radii, out.means2d.grad(), out.width, out.height);
    if (gs::densifies(dopt, step)) gs::densify_and_prune(p, adam.get(), stats, dopt, extent, step);
  }
  const double after = eval_psnr(0);
  std::printf("[ fit ] PSNR on train view %zu: %.2f dB -> %.2f dB, Gaussians %lld -> %lld\n",
              train[0], before, after, (long long)start_count, (long long)p.size());
  EXPECT_GT(after, before + 3.0);
}

}  // namespace
