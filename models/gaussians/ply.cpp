// INRIA .ply export (atomic: temp name + rename) and validated import (see ply.h); the layout
// is the one the standard 3DGS viewers read.
#include "models/gaussians/ply.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "distributed/errors.h"

namespace tessera::models::gaussians {
namespace {

constexpr int64_t kRestPerChannel = kShCoeffs - 1;  // 15 coefficients of degrees 1..3

std::vector<std::string> property_names() {
  std::vector<std::string> names = {"x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"};
  for (int64_t i = 0; i < 3 * kRestPerChannel; ++i) names.push_back("f_rest_" + std::to_string(i));
  names.push_back("opacity");
  for (int i = 0; i < 3; ++i) names.push_back("scale_" + std::to_string(i));
  for (int i = 0; i < 4; ++i) names.push_back("rot_" + std::to_string(i));
  return names;
}

bool little_endian_host() {
  const uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw UserError("read_ply: " + path + ": " + what +
                  " (expected an INRIA 3DGS .ply: binary_little_endian 1.0, one vertex element "
                  "of float properties)");
}

}  // namespace

std::string ply_header(int64_t n) {
  std::string h = "ply\nformat binary_little_endian 1.0\nelement vertex " + std::to_string(n) + "\n";
  for (const std::string& name : property_names()) h += "property float " + name + "\n";
  return h + "end_header\n";
}

PlyWriter::PlyWriter(const std::string& path, int64_t count)
    : path_(path),
      tmp_(path + ".tmp-" + std::to_string(static_cast<long long>(::getpid()))),
      count_(count) {
  TORCH_CHECK(little_endian_host(), "write_ply: a big-endian host is not supported");
  TORCH_CHECK(count >= 0, "write_ply: negative count");
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (file_ == nullptr)
    throw UserError("write_ply: cannot open " + tmp_ + " for writing; check the folder");
  const std::string header = ply_header(count);
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size()) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    throw UserError("write_ply: writing " + tmp_ + " failed (disk full?)");
  }
}

PlyWriter::~PlyWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void PlyWriter::append(const GaussianParams& params) {
  TORCH_CHECK(file_ != nullptr, "write_ply: append after finish");
  torch::NoGradGuard no_grad;
  const int64_t n = params.size();
  if (n == 0) return;
  if (written_ + n > count_)
    throw std::logic_error("write_ply: more rows than the header's " + std::to_string(count_));
  auto f32 = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32); };
  const torch::Tensor table =
      torch::cat({f32(params.means), torch::zeros({n, 3}), f32(params.sh_dc).reshape({n, 3}),
                  f32(params.sh_rest).permute({0, 2, 1}).reshape({n, 3 * kRestPerChannel}),
                  f32(params.opacity_logits).reshape({n, 1}), f32(params.log_scales),
                  f32(params.quats)},
                 1)
          .contiguous();  // [n, 62]
  TORCH_CHECK(table.size(1) == kPlyProperties, "write_ply: internal layout error");
  const size_t values = static_cast<size_t>(table.numel());
  if (std::fwrite(table.data_ptr<float>(), sizeof(float), values, file_) != values) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    throw UserError("write_ply: writing " + tmp_ + " failed (disk full?)");
  }
  written_ += n;
}

void PlyWriter::finish() {
  TORCH_CHECK(file_ != nullptr, "write_ply: finish twice");
  if (written_ != count_)
    throw std::logic_error("write_ply: " + std::to_string(written_) + " rows written, the header "
                           "says " + std::to_string(count_));
  const bool flushed = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(tmp_.c_str());
    throw UserError("write_ply: writing " + tmp_ + " failed (disk full?)");
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    throw UserError("write_ply: cannot rename " + tmp_ + " to " + path_);
  }
}

void write_ply(const std::string& path, const GaussianParams& params) {
  PlyWriter writer(path, params.size());
  writer.append(params);
  writer.finish();
}

GaussianParams read_ply(const std::string& path, torch::Device device, int64_t part,
                        int64_t parts, int64_t* total) {
  TORCH_CHECK(little_endian_host(), "read_ply: a big-endian host is not supported");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("read_ply: cannot open " + path);
  auto next_line = [&](std::string& line) {
    if (!std::getline(in, line)) bad(path, "the header ends before end_header");
    if (!line.empty() && line.back() == '\r') line.pop_back();
  };
  std::string line;
  if (!std::getline(in, line)) bad(path, "not a ply file (empty)");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line != "ply") bad(path, "not a ply file (no 'ply' magic line)");
  bool have_format = false, in_vertex = false, have_vertex = false;
  int64_t count = -1;
  std::vector<std::string> props;
  for (;;) {
    next_line(line);
    std::istringstream words(line);
    std::string word;
    words >> word;
    if (word == "end_header") break;
    if (word == "comment" || word == "obj_info" || word.empty()) continue;
    if (word == "format") {
      std::string kind, version;
      words >> kind >> version;
      if (kind != "binary_little_endian" || version != "1.0")
        bad(path, "format '" + kind + " " + version + "' is not binary_little_endian 1.0");
      have_format = true;
    } else if (word == "element") {
      std::string name, n;
      words >> name >> n;
      if (name != "vertex" || have_vertex)
        bad(path, "element '" + name + "': only one element, 'vertex', is supported");
      try {
        size_t used = 0;
        count = std::stoll(n, &used);
        if (used != n.size() || count < 0) throw std::invalid_argument(n);
      } catch (const std::exception&) {
        bad(path, "vertex count '" + n + "' is not a non-negative integer");
      }
      in_vertex = have_vertex = true;
    } else if (word == "property") {
      if (!in_vertex) bad(path, "a property before the vertex element");
      std::string type, name;
      words >> type >> name;
      if (type == "list") bad(path, "list property '" + line + "'");
      if (type != "float" && type != "float32")
        bad(path, "property '" + name + "' has type '" + type + "', not float");
      props.push_back(name);
    } else {
      bad(path, "unknown header line '" + line + "'");
    }
  }
  if (!have_format) bad(path, "no format line");
  if (!have_vertex) bad(path, "no vertex element");
  std::map<std::string, int64_t> column;
  for (size_t i = 0; i < props.size(); ++i)
    if (!column.emplace(props[i], static_cast<int64_t>(i)).second)
      bad(path, "property '" + props[i] + "' appears twice");
  auto col = [&](const std::string& name) {
    auto it = column.find(name);
    if (it == column.end()) bad(path, "missing property '" + name + "'");
    return it->second;
  };
  int64_t rest = 0;
  while (column.count("f_rest_" + std::to_string(rest))) ++rest;
  int64_t rest_total = 0;
  for (const auto& [name, index] : column)
    if (name.rfind("f_rest_", 0) == 0) ++rest_total;
  if (rest_total != rest)
    bad(path, "f_rest properties are not numbered 0.." + std::to_string(rest_total - 1));
  if (rest != 0 && rest != 9 && rest != 24 && rest != 3 * kRestPerChannel)
    bad(path, std::to_string(rest) + " f_rest properties: expected 0, 9, 24 or 45 (SH degree 0..3)");
  const int64_t per_channel = rest / 3;

  // The data: exactly count x stride floats, nothing after.
  const int64_t stride = static_cast<int64_t>(props.size());
  const std::streampos data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const int64_t available = static_cast<int64_t>(in.tellg() - data_start);
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(float));
  if (row_bytes > 0 && count > available / row_bytes)  // also guards count * row_bytes overflow
    bad(path, "the data holds " + std::to_string(available) + " bytes, fewer than " +
                  std::to_string(count) + " vertices of " + std::to_string(stride) +
                  " floats need (truncated file?)");
  const int64_t expected = count * row_bytes;
  if (available != expected)
    bad(path, "the data holds " + std::to_string(available) + " bytes but " +
                  std::to_string(count) + " vertices of " + std::to_string(stride) +
                  " floats need " + std::to_string(expected) +
                  (available < expected ? " (truncated file?)" : " (trailing bytes)"));
  if (total != nullptr) *total = count;
  const auto [first, last] = even_slice(count, part, parts);
  count = last - first;
  in.seekg(data_start + static_cast<std::streamoff>(first * row_bytes));
  torch::Tensor table = torch::empty({count, stride}, torch::kFloat32);
  in.read(reinterpret_cast<char*>(table.data_ptr<float>()), count * row_bytes);
  if (!in) bad(path, "reading the vertex data failed");

  auto cols = [&](std::initializer_list<std::string> names) {
    std::vector<int64_t> idx;
    for (const auto& name : names) idx.push_back(col(name));
    return table.index_select(1, torch::tensor(idx, torch::kInt64));
  };
  const torch::Tensor means = cols({"x", "y", "z"});
  const torch::Tensor dc = cols({"f_dc_0", "f_dc_1", "f_dc_2"}).reshape({count, 1, 3});
  const torch::Tensor opacity = cols({"opacity"}).reshape({count});
  const torch::Tensor scales = cols({"scale_0", "scale_1", "scale_2"});
  const torch::Tensor quats = cols({"rot_0", "rot_1", "rot_2", "rot_3"});
  torch::Tensor sh_rest = torch::zeros({count, kRestPerChannel, 3});
  if (per_channel > 0) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < rest; ++i) idx.push_back(col("f_rest_" + std::to_string(i)));
    // Channel-major in the file: [N, 3, per_channel] -> [N, per_channel, 3].
    const torch::Tensor file_rest =
        table.index_select(1, torch::tensor(idx, torch::kInt64)).reshape({count, 3, per_channel});
    sh_rest.slice(1, 0, per_channel).copy_(file_rest.permute({0, 2, 1}));
  }
  GaussianParams p = make_params(means, scales, quats, opacity, dc, sh_rest);
  if (device != torch::kCPU)
    for (torch::Tensor* t : p.fields()) *t = t->detach().to(device).set_requires_grad(true);
  return p;
}

namespace {

// means -> means * scale + shift, log_scales -> log_scales + log(scale); the rest unchanged.
GaussianParams similarity(const GaussianParams& params, double scale, const std::array<double, 3>& shift) {
  const torch::Tensor t =
      torch::tensor({shift[0], shift[1], shift[2]}, torch::kFloat64).to(params.means.device());
  const torch::Tensor means =
      (params.means.detach().to(torch::kFloat64) * scale + t).to(torch::kFloat32);
  const torch::Tensor log_scales = params.log_scales.detach() + static_cast<float>(std::log(scale));
  return make_params(means, log_scales, params.quats.detach(), params.opacity_logits.detach(),
                     params.sh_dc.detach(), params.sh_rest.detach());
}

}  // namespace

GaussianParams world_to_capture(const GaussianParams& params, double scale,
                                const std::array<double, 3>& offset) {
  return similarity(params, 1.0 / scale, {-offset[0] / scale, -offset[1] / scale, -offset[2] / scale});
}

GaussianParams capture_to_world(const GaussianParams& params, double scale,
                                const std::array<double, 3>& offset) {
  return similarity(params, scale, offset);
}

}  // namespace tessera::models::gaussians
