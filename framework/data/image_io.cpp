// PNG and JPEG files to and from uint8 tensors through Debian's libstb (stb_image, stb_image_write;
// the implementations live in libstb.so), and integer box-filter downscaling.
#include "framework/data/image_io.h"

#include <png.h>
#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <csetjmp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/whole_file.h"

namespace tessera::data {

namespace {

constexpr int kGreyAlphaChannels = 2;  // stb reports grey+alpha as 2 channels
constexpr int kRgbaChannels = 4;

// The whole file, or a UserError saying why it cannot be read.
std::vector<unsigned char> read_bytes(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw UserError("cannot open image " + path + " (missing or unreadable)");
  std::vector<unsigned char> bytes;
  unsigned char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0;)
    bytes.insert(bytes.end(), buffer, buffer + n);
  if (std::ferror(file.get())) throw UserError("cannot read image " + path + " (I/O error)");
  return bytes;
}

std::string stb_reason() {
  const char* reason = stbi_failure_reason();
  return reason ? reason : "unknown reason";
}

}  // namespace

LoadedImage read_image_file(const std::string& path) {
  const std::vector<unsigned char> bytes = read_bytes(path);
  if (bytes.empty()) throw UserError("image " + path + " is an empty file");
  int width = 0, height = 0, channels = 0;
  const int size = static_cast<int>(bytes.size());
  if (!stbi_info_from_memory(bytes.data(), size, &width, &height, &channels))
    throw UserError("image " + path + " is not a readable PNG or JPEG (" + stb_reason() + ")");
  const bool has_alpha = channels == kGreyAlphaChannels || channels == kRgbaChannels;
  const int wanted = has_alpha ? 4 : 3;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes.data(), size, &width, &height, &channels, wanted),
      &stbi_image_free);
  if (!pixels)
    throw UserError("image " + path + " could not be decoded (" + stb_reason() + ")");
  const torch::Tensor all =
      torch::from_blob(pixels.get(), {height, width, wanted}, torch::kUInt8).clone();
  LoadedImage image;
  image.rgb = all.slice(2, 0, 3).contiguous();
  if (has_alpha) image.alpha = all.select(2, 3).contiguous();
  return image;
}

namespace {

void append_bytes(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data),
                                             static_cast<size_t>(size));
}

}  // namespace

void write_png(const std::string& path, const torch::Tensor& rgb, const torch::Tensor& alpha) {
  if (!rgb.defined() || rgb.dim() != 3 || rgb.size(2) != 3 || rgb.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("write_png " + path + ": rgb must be uint8 [H, W, 3]");
  const int64_t height = rgb.size(0), width = rgb.size(1);
  torch::Tensor pixels = rgb.to(torch::kCPU);
  if (alpha.defined()) {
    if (alpha.dim() != 2 || alpha.size(0) != height || alpha.size(1) != width ||
        alpha.scalar_type() != torch::kUInt8)
      throw std::invalid_argument("write_png " + path + ": alpha must be uint8 [H, W] like rgb");
    pixels = torch::cat({pixels, alpha.to(torch::kCPU).unsqueeze(2)}, 2);
  }
  pixels = pixels.contiguous();
  const int channels = static_cast<int>(pixels.size(2));
  // Encoded in memory, then written with every write and the close checked (stb's file writer
  // ignores a short write on a full disk).
  std::string bytes;
  if (!stbi_write_png_to_func(append_bytes, &bytes, static_cast<int>(width),
                              static_cast<int>(height), channels, pixels.data_ptr<uint8_t>(),
                              static_cast<int>(width) * channels))
    throw std::runtime_error("write_png " + path + ": the PNG encoder failed");
  write_whole_file(path, bytes, "PNG");
}

torch::Tensor unit_to_bytes(const torch::Tensor& image) {
  return (image.detach().to(torch::kCPU, torch::kFloat32) * 255.0f)
      .round()
      .clamp(0, 255)
      .to(torch::kUInt8)
      .contiguous();
}

void write_png_unit(const std::string& path, const torch::Tensor& image) {
  write_png(path, unit_to_bytes(image));
}

std::string encode_png_unit(const torch::Tensor& image) {
  if (!image.defined() || image.dim() != 3 || image.size(2) != 3)
    throw std::invalid_argument("encode_png_unit: image must be [H, W, 3]");
  const torch::Tensor pixels = unit_to_bytes(image);
  const int width = static_cast<int>(pixels.size(1));
  std::string bytes;
  if (!stbi_write_png_to_func(append_bytes, &bytes, width, static_cast<int>(pixels.size(0)), 3,
                              pixels.data_ptr<uint8_t>(), width * 3))
    throw std::runtime_error("encode_png_unit: the PNG encoder failed");
  return bytes;
}

namespace {

// libpng's writer of 16-bit greyscale rows (big-endian samples); false on any libpng error. No
// object with a destructor lives in this frame, which libpng's errors leave by longjmp.
bool write_gray16(FILE* file, const uint8_t* rows, uint32_t width, uint32_t height,
                  png_text* text, int text_count) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_init_io(png, file);
  png_set_IHDR(png, info, width, height, 16, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (text_count > 0) png_set_text(png, info, text, text_count);
  png_write_info(png, info);
  for (uint32_t y = 0; y < height; ++y) png_write_row(png, rows + static_cast<size_t>(y) * width * 2);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

void write_png16(const std::string& path, const torch::Tensor& values, double full_scale,
                 const std::vector<std::pair<std::string, std::string>>& text) {
  if (!values.defined() || values.dim() != 2)
    throw std::invalid_argument("write_png16 " + path + ": values must be [H, W]");
  const double scale = full_scale > 0 ? 65535.0 / full_scale : 0.0;
  // Big-endian 16-bit samples, as PNG stores them.
  const torch::Tensor samples = (values.detach().to(torch::kCPU, torch::kFloat64) * scale)
                                    .round()
                                    .clamp(0, 65535)
                                    .to(torch::kInt32)
                                    .contiguous();
  const int64_t height = samples.size(0), width = samples.size(1);
  std::vector<uint8_t> rows(static_cast<size_t>(height * width * 2));
  const int32_t* s = samples.data_ptr<int32_t>();
  for (int64_t i = 0; i < height * width; ++i) {
    rows[2 * i] = static_cast<uint8_t>(s[i] >> 8);
    rows[2 * i + 1] = static_cast<uint8_t>(s[i] & 0xFF);
  }
  std::vector<png_text> chunks(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    chunks[i].compression = PNG_TEXT_COMPRESSION_NONE;
    chunks[i].key = const_cast<char*>(text[i].first.c_str());
    chunks[i].text = const_cast<char*>(text[i].second.c_str());
  }
  write_whole_file_with(path, "PNG", [&](const std::string& partial) {
    std::FILE* file = std::fopen(partial.c_str(), "wb");
    if (!file) return false;
    const bool wrote = write_gray16(file, rows.data(), static_cast<uint32_t>(width),
                                    static_cast<uint32_t>(height), chunks.data(),
                                    static_cast<int>(chunks.size()));
    return (std::fclose(file) == 0) && wrote;
  });
}

void write_npy(const std::string& path, const torch::Tensor& array) {
  const torch::Tensor values = array.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  std::string shape;  // "H, W"; a 1-D shape is "N," as a Python tuple
  for (int64_t d = 0; d < values.dim(); ++d)
    shape += (d > 0 ? ", " : "") + std::to_string(values.size(d));
  if (values.dim() == 1) shape += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Magic (6) + version (2) + header length (2) + header + '\n', padded to a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xFF);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(values.data_ptr<float>()),
               static_cast<size_t>(values.numel()) * sizeof(float));
  write_whole_file(path, bytes, "array");
}

torch::Tensor downscale(const torch::Tensor& image, int factor) {
  if (factor < 1) throw std::invalid_argument("downscale factor must be >= 1");
  if (!image.defined() || (image.dim() != 2 && image.dim() != 3) ||
      image.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("downscale expects uint8 [H, W] or [H, W, C]");
  if (factor == 1) return image;
  const int64_t height = image.size(0) / factor, width = image.size(1) / factor;
  if (height == 0 || width == 0)
    throw std::invalid_argument("downscale: an image of " + std::to_string(image.size(1)) + "x" +
                                std::to_string(image.size(0)) + " is smaller than the factor " +
                                std::to_string(factor));
  const torch::Tensor pixels = image.dim() == 2 ? image.unsqueeze(2) : image;
  const int64_t channels = pixels.size(2);
  // Each output pixel is the mean of a factor x factor block, rounded half up, in exact integers.
  const int64_t block = static_cast<int64_t>(factor) * factor;
  torch::Tensor sums = pixels.slice(0, 0, height * factor)
                           .slice(1, 0, width * factor)
                           .to(torch::kInt32)
                           .reshape({height, factor, width, factor, channels})
                           .sum({1, 3}, false, torch::kInt32);
  torch::Tensor out = torch::div(sums + block / 2, block, "floor").to(torch::kUInt8);
  return image.dim() == 2 ? out.squeeze(2).contiguous() : out.contiguous();
}

}  // namespace tessera::data
