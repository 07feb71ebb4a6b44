// Fuzz target: the two PLY readers, the 3DGS one (models/gaussians/ply.h, INRIA layout) and the
// point-cloud one of the importers (framework/data/import.h, ASCII or binary).
// Input: the bytes of a .ply file. Checks: each reader accepts it or raises UserError; a Gaussian
// file read in two parts gives the same total and the whole file's rows.
#include "framework/data/import.h"
#include "models/gaussians/ply.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using models::gaussians::GaussianParams;
  const std::string path = fuzz::scratch_dir() + "/points.ply";
  fuzz::write_bytes(path, data, size);
  GaussianParams whole;
  if (fuzz::accepts("read_ply", [&] { whole = models::gaussians::read_ply(path); })) {
    for (const torch::Tensor* field : whole.fields())
      if (field->size(0) != whole.size()) fuzz::finding("read_ply: fields of different lengths");
    int64_t total = -1;
    GaussianParams second;
    if (!fuzz::accepts("read_ply part", [&] {
          second = models::gaussians::read_ply(path, torch::kCPU, 1, 2, &total);
        }))
      fuzz::finding("read_ply read the whole file but refused its second half");
    if (total != whole.size()) fuzz::finding("read_ply: the total of a part differs from the whole");
    const int64_t first = whole.size() - second.size();
    const auto bits = [](const torch::Tensor& t) { return t.detach().view(torch::kInt32); };  // NaN == NaN
    if (!torch::equal(bits(second.means), bits(whole.means.slice(0, first))))
      fuzz::finding("read_ply: the second half is not the whole file's last rows");
  }
  fuzz::accepts("read_ply_points", [&] {
    const auto [xyz, rgb] = data::read_ply_points(path);
    if (xyz.dim() != 2 || xyz.size(1) != 3 || rgb.sizes() != xyz.sizes())
      fuzz::finding("read_ply_points: xyz " + c10::str(xyz.sizes()) + ", rgb " + c10::str(rgb.sizes()));
  });
  return 0;
}
