// PNG and JPEG files to and from uint8 tensors (stb_image / stb_image_write), and resizing by an
// integer factor with box filtering, for the dataset importers and eval renders.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace tessera::data {

struct LoadedImage {
  torch::Tensor rgb;    // uint8 [H, W, 3]
  torch::Tensor alpha;  // uint8 [H, W], undefined when the file has no alpha channel
};

// Throws UserError naming the file when it is missing, unreadable or not an image.
LoadedImage read_image_file(const std::string& path);
// The writers below write whole files or none (framework/data/whole_file.h): a reader sees the
// whole file or none, and a failure (UserError) leaves nothing behind.
// Writes PNG; rgb uint8 [H, W, 3], alpha uint8 [H, W] or undefined. Throws on failure.
void write_png(const std::string& path, const torch::Tensor& rgb, const torch::Tensor& alpha = {});
// A rendered image, float with values in [0, 1], as 8 bits per value: times 255, rounded,
// clamped; uint8, contiguous, on the CPU.
torch::Tensor unit_to_bytes(const torch::Tensor& image);
// Writes a rendered image, float [H, W, 3] with values in [0, 1] (clamped), as an 8-bit PNG
// (unit_to_bytes).
void write_png_unit(const std::string& path, const torch::Tensor& image);
// The PNG file bytes of a rendered image as write_png_unit writes it (RGB, 8 bits).
std::string encode_png_unit(const torch::Tensor& image);
// Writes a 16-bit greyscale PNG (libpng) of `values` float [H, W] scaled so that `full_scale`
// is 65535 (values clamped to [0, full_scale], rounded), with the text chunks `text` (key, value)
// in its header. Throws UserError when the file cannot be written.
void write_png16(const std::string& path, const torch::Tensor& values, double full_scale,
                 const std::vector<std::pair<std::string, std::string>>& text = {});
// Writes `array` (float32, any shape, C order) as a NumPy .npy file (format 1.0), which
// numpy.load reads. Throws UserError when the file cannot be written.
void write_npy(const std::string& path, const torch::Tensor& array);
// Box-filter downscale of uint8 [H, W] or [H, W, C] by `factor` (H and W are divided, rounding
// down; the last partial block is dropped).
torch::Tensor downscale(const torch::Tensor& image, int factor);

}  // namespace tessera::data
