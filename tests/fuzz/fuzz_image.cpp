// Fuzz target: the image decoder path of the importers (framework/data/image_io.h and
// probe_image in import.h): PNG and JPEG through stb_image, then the box downscale.
// Input: the bytes of an image file. Checks: probe_image and read_image_file accept or raise
// UserError, agree on the size and on alpha, and a decoded image downscales to the floor of its
// size.
#include "framework/data/image_io.h"
#include "framework/data/import.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string path = fuzz::scratch_dir() + "/image.png";
  fuzz::write_bytes(path, data, size);
  data::ImageInfo info;
  const bool probed = fuzz::accepts("probe_image", [&] { info = data::probe_image(path); });
  data::LoadedImage image;
  const bool read = fuzz::accepts("read_image_file", [&] { image = data::read_image_file(path); });
  if (!read) return 0;
  if (!probed) fuzz::finding("read_image_file decoded an image that probe_image refused");
  const auto sizes = image.rgb.sizes().vec();
  if (sizes != std::vector<int64_t>{info.height, info.width, 3} || image.rgb.dtype() != torch::kUInt8)
    fuzz::finding("decoded " + c10::str(image.rgb.sizes()) + ", probed " +
                  std::to_string(info.height) + " x " + std::to_string(info.width));
  if (image.alpha.defined() != info.has_alpha())
    fuzz::finding("probe_image and read_image_file disagree on alpha");
  if (image.alpha.defined() && image.alpha.sizes().vec() != std::vector<int64_t>{info.height, info.width})
    fuzz::finding("alpha is " + c10::str(image.alpha.sizes()));
  for (const int factor : {2, 3}) {
    if (info.height < factor || info.width < factor) continue;
    const torch::Tensor small = data::downscale(image.rgb, factor);
    if (small.sizes().vec() != std::vector<int64_t>{info.height / factor, info.width / factor, 3})
      fuzz::finding("downscale by " + std::to_string(factor) + " gave " + c10::str(small.sizes()));
  }
  return 0;
}
