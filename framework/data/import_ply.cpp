// Point clouds as PLY (x y z red green blue vertices): read for nerfstudio's ply_file_path and
// written by the nerfstudio export (points3D.ply, binary little-endian).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/import.h"

namespace tessera::data {

namespace {

struct Property {
  std::string name;
  std::string type;
  int bytes = 0;
};

int type_bytes(const std::string& type) {
  if (type == "char" || type == "uchar" || type == "int8" || type == "uint8") return 1;
  if (type == "short" || type == "ushort" || type == "int16" || type == "uint16") return 2;
  if (type == "int" || type == "uint" || type == "int32" || type == "uint32" || type == "float" ||
      type == "float32")
    return 4;
  if (type == "double" || type == "float64") return 8;
  return 0;
}

// One binary little-endian value of `type` as a double.
double decode(const char* at, const std::string& type) {
  const auto load = [at](auto value) {
    std::memcpy(&value, at, sizeof(value));
    return static_cast<double>(value);
  };
  if (type == "char" || type == "int8") return load(int8_t{});
  if (type == "uchar" || type == "uint8") return load(uint8_t{});
  if (type == "short" || type == "int16") return load(int16_t{});
  if (type == "ushort" || type == "uint16") return load(uint16_t{});
  if (type == "int" || type == "int32") return load(int32_t{});
  if (type == "uint" || type == "uint32") return load(uint32_t{});
  if (type == "float" || type == "float32") return load(float{});
  return load(double{});
}

bool is_float(const std::string& type) {
  return type == "float" || type == "float32" || type == "double" || type == "float64";
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> read_ply_points(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open PLY file (missing or unreadable)");
  std::string line;
  if (!std::getline(in, line) || line.rfind("ply", 0) != 0)
    throw UserError(path + ": not a PLY file (no 'ply' magic line)");
  std::string format;
  int64_t vertices = -1;
  bool vertex_first = true, in_vertex = false, header_ended = false;
  std::vector<Property> properties;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream words(line);
    std::string word;
    words >> word;
    if (word == "end_header") {
      header_ended = true;
      break;
    }
    if (word == "format") {
      words >> format;
    } else if (word == "element") {
      std::string name;
      int64_t count = -1;
      words >> name >> count;
      in_vertex = name == "vertex";
      if (in_vertex && (!words || count < 0))
        throw UserError(path + ": '" + line + "': the vertex count is not a whole number >= 0");
      if (in_vertex) vertices = count;
      else if (vertices < 0) vertex_first = false;
    } else if (word == "property" && in_vertex) {
      Property p;
      words >> p.type >> p.name;
      p.bytes = type_bytes(p.type);
      if (p.type == "list" || p.bytes == 0)
        throw UserError(path + ": vertex property '" + line + "' is not supported");
      properties.push_back(p);
    }
  }
  if (!header_ended) throw UserError(path + ": the PLY header has no 'end_header' line");
  if (format != "ascii" && format != "binary_little_endian")
    throw UserError(path + ": PLY format '" + format + "' is not supported (ascii or "
                    "binary_little_endian)");
  if (vertices < 0 || !vertex_first)
    throw UserError(path + ": needs 'vertex' as the first element");
  const auto index_of = [&](const char* name) {
    for (size_t i = 0; i < properties.size(); ++i)
      if (properties[i].name == name) return static_cast<int>(i);
    return -1;
  };
  const int xyz_at[3] = {index_of("x"), index_of("y"), index_of("z")};
  const int rgb_at[3] = {index_of("red"), index_of("green"), index_of("blue")};
  if (xyz_at[0] < 0 || xyz_at[1] < 0 || xyz_at[2] < 0)
    throw UserError(path + ": vertices need x, y and z properties");

  // The count must fit in what follows the header (other elements may follow the vertices): a
  // binary vertex takes `stride` bytes, an ASCII one at least one digit and a separator per value.
  size_t stride = 0;
  for (const Property& p : properties) stride += static_cast<size_t>(p.bytes);
  std::error_code size_error;
  const auto file_bytes = std::filesystem::file_size(path, size_error);
  std::streamoff header_end = in.tellg();
  if (header_end < 0 && in.eof()) header_end = static_cast<std::streamoff>(file_bytes);  // no data
  if (header_end < 0 || size_error) throw UserError(path + ": cannot read past the PLY header");
  const uint64_t data_bytes = file_bytes - static_cast<uint64_t>(header_end);
  // (+1 for ASCII: the last line may lack its newline.)
  const bool ascii = format == "ascii";
  const uint64_t min_vertex_bytes = ascii ? 2 * properties.size() : stride;
  const uint64_t most = (data_bytes + (ascii ? 1 : 0)) / min_vertex_bytes;
  if (static_cast<uint64_t>(vertices) > most)
    throw UserError(path + ": declares " + std::to_string(vertices) + " vertices, but its " +
                    std::to_string(data_bytes) + " bytes of data hold at most " +
                    std::to_string(most) + " (truncated file?)");

  torch::Tensor xyz = torch::empty({vertices, 3}, torch::kFloat64);
  torch::Tensor rgb = torch::full({vertices, 3}, 255, torch::kUInt8);
  double* xyz_out = xyz.data_ptr<double>();
  uint8_t* rgb_out = rgb.data_ptr<uint8_t>();
  std::vector<double> values(properties.size());
  std::vector<char> record(stride);
  for (int64_t v = 0; v < vertices; ++v) {
    if (format == "ascii") {
      for (double& value : values)
        if (!(in >> value)) throw UserError(path + ": vertex " + std::to_string(v) + " is incomplete");
    } else {
      if (!in.read(record.data(), static_cast<std::streamsize>(stride)))
        throw UserError(path + ": truncated at vertex " + std::to_string(v));
      size_t offset = 0;
      for (size_t i = 0; i < properties.size(); ++i) {
        values[i] = decode(record.data() + offset, properties[i].type);
        offset += static_cast<size_t>(properties[i].bytes);
      }
    }
    for (int a = 0; a < 3; ++a) xyz_out[v * 3 + a] = values[xyz_at[a]];
    for (int c = 0; c < 3; ++c) {
      if (rgb_at[c] < 0) continue;
      double value = values[rgb_at[c]];
      if (is_float(properties[rgb_at[c]].type)) value *= 255.0;  // float colors are in [0, 1]
      rgb_out[v * 3 + c] = static_cast<uint8_t>(std::clamp(std::lround(value), 0L, 255L));
    }
  }
  return {xyz, rgb};
}

void write_ply_points(const std::string& path, const torch::Tensor& xyz, const torch::Tensor& rgb) {
  // float64 coordinates are written as double: a transformed export then loses nothing.
  const bool wide = xyz.scalar_type() == torch::kFloat64;
  const torch::Tensor points = xyz.to(wide ? torch::kFloat64 : torch::kFloat32).contiguous();
  const torch::Tensor colors = rgb.to(torch::kUInt8).contiguous();
  const int64_t count = points.size(0);
  std::ofstream out(path, std::ios::binary);
  if (!out) throw UserError("cannot write " + path + " (check that the folder is writable)");
  const char* type = wide ? "double" : "float";
  out << "ply\nformat binary_little_endian 1.0\ncomment written by tessera\n"
      << "element vertex " << count << "\n"
      << "property " << type << " x\nproperty " << type << " y\nproperty " << type << " z\n"
      << "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n";
  const auto* p = static_cast<const char*>(points.data_ptr());
  const size_t coords = 3 * points.element_size();
  const uint8_t* c = colors.data_ptr<uint8_t>();
  std::vector<char> record(coords + 3);  // 3 coordinates and 3 bytes, packed
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(record.data(), p + i * coords, coords);
    std::memcpy(record.data() + coords, c + i * 3, 3);
    out.write(record.data(), static_cast<std::streamsize>(record.size()));
  }
  if (!out.flush()) throw UserError("cannot write " + path + " (disk full?)");
}

}  // namespace tessera::data
