// Fuzz target: the tessera-scene reader (framework/data/scene.h, docs/formats.md).
// Input: the bytes of an HDF5 file. Checks: SceneReader opens it or raises UserError, and so does
// every read of an opened scene; what it returns has the shape its cameras promise.
#include "framework/data/scene.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr size_t kMaxViewsRead = 16;  // enough to reach every layout path, bounded per input

void expect_shape(const torch::Tensor& t, std::vector<int64_t> shape, const std::string& what) {
  if (t.sizes().vec() != shape)
    tessera::fuzz::finding(what + " has shape " + c10::str(t.sizes()) + ", the cameras say " +
                           c10::str(at::IntArrayRef(shape)));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string path = fuzz::scratch_dir() + "/scene.h5";
  fuzz::write_bytes(path, data, size);
  std::unique_ptr<data::SceneReader> reader;
  if (!fuzz::accepts("SceneReader", [&] { reader = std::make_unique<data::SceneReader>(path); }))
    return 0;
  const auto& cameras = reader->cameras();
  for (size_t i = 0; i < cameras.size() && i < kMaxViewsRead; ++i) {
    const int64_t h = cameras[i].height, w = cameras[i].width;
    fuzz::accepts("read_image", [&] { expect_shape(reader->read_image(i), {h, w, 3}, "read_image"); });
    fuzz::accepts("read_image_over_background", [&] {
      expect_shape(reader->read_image_over_background(i), {h, w, 3}, "read_image_over_background");
    });
    if (reader->has_alpha())
      fuzz::accepts("read_alpha", [&] { expect_shape(reader->read_alpha(i), {h, w}, "read_alpha"); });
  }
  fuzz::accepts("read_points", [&] {
    const torch::Tensor xyz = reader->read_points_xyz(), rgb = reader->read_points_rgb();
    expect_shape(xyz, {xyz.size(0), 3}, "read_points_xyz");
    expect_shape(rgb, {xyz.size(0), 3}, "read_points_rgb");
  });
  size_t in_splits = 0;
  for (const auto split : {data::Split::Train, data::Split::Val, data::Split::Test})
    in_splits += reader->indices(split).size();
  if (in_splits != cameras.size())
    fuzz::finding("the splits hold " + std::to_string(in_splits) + " of " +
                  std::to_string(cameras.size()) + " cameras");
  fuzz::accepts("fingerprint", [&] { (void)reader->fingerprint(); });
  (void)reader->summary();
  return 0;
}
