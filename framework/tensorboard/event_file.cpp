#include "framework/tensorboard/event_file.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/tensorboard/event.pb.h"

namespace tessera {

namespace {

namespace pb = tessera::tensorboard;

constexpr int32_t kDtypeString = 7;  // TensorBoard's DT_STRING

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected poly
    table[i] = c;
  }
  return table;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

pb::Event event_at(int64_t step) {
  pb::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  return event;
}

void add_numbers(pb::Summary& summary, const nlohmann::json& object, const std::string& prefix) {
  for (const auto& [key, value] : object.items()) {
    const std::string tag = prefix + key;
    if (value.is_object()) {
      add_numbers(summary, value, tag + "/");
    } else if (value.is_number() || value.is_boolean()) {
      pb::Summary::Value* v = summary.add_value();
      v->set_tag(tag);
      v->set_simple_value(value.is_boolean() ? (value.get<bool>() ? 1.0f : 0.0f)
                                             : static_cast<float>(value.get<double>()));
    }
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

TensorBoardEventFile::TensorBoardEventFile(const std::string& dir, int64_t resumed_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." +
                                         host + "." + std::to_string(getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw UserError("cannot write " + path_ + "; check run.out_dir, or set run.tensorboard = false");
  pb::Event version = event_at(0);
  version.set_file_version("brain.Event:2");  // version 2: readers honour restart markers
  write_event(version.SerializeAsString());
  if (resumed_step > 0) {
    pb::Event restart = event_at(resumed_step + 1);
    restart.mutable_session_log()->set_status(pb::SessionLog::START);
    write_event(restart.SerializeAsString());
  }
}

void TensorBoardEventFile::scalars(const nlohmann::json& record, int64_t step) {
  pb::Event event = event_at(step);
  add_numbers(*event.mutable_summary(), record, "");
  if (event.summary().value_size() > 0) write_event(event.SerializeAsString());
}

void TensorBoardEventFile::image(const std::string& tag, int64_t step, int64_t height,
                                 int64_t width, const std::string& png) {
  pb::Event event = event_at(step);
  pb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  pb::Summary::Image* image = v->mutable_image();
  image->set_height(static_cast<int32_t>(height));
  image->set_width(static_cast<int32_t>(width));
  image->set_colorspace(3);
  image->set_encoded_image_string(png);
  write_event(event.SerializeAsString());
}

void TensorBoardEventFile::text(const std::string& tag, int64_t step, const std::string& markdown) {
  pb::Event event = event_at(step);
  pb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  pb::Tensor* tensor = v->mutable_tensor();
  tensor->set_dtype(kDtypeString);
  tensor->add_string_val(markdown);
  write_event(event.SerializeAsString());
}

void TensorBoardEventFile::write_event(const std::string& event_bytes) {
  if (failed_) return;
  // TFRecord: uint64 length, masked CRC of the length, the data, masked CRC of the data; little
  // endian, as every machine Tessera runs on is.
  const uint64_t length = event_bytes.size();
  const uint32_t length_crc = masked_crc32c(&length, sizeof(length));
  const uint32_t data_crc = masked_crc32c(event_bytes.data(), event_bytes.size());
  out_.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out_.write(reinterpret_cast<const char*>(&length_crc), sizeof(length_crc));
  out_.write(event_bytes.data(), static_cast<std::streamsize>(event_bytes.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), sizeof(data_crc));
  out_.flush();  // a reader (tensorboard --logdir) sees each record as it is written
  if (!out_) {
    // Training goes on (metrics.jsonl and the snapshots have their own checks).
    spdlog::warn("cannot write {} (disk full?): TensorBoard records stop here", path_);
    failed_ = true;
  }
}

}  // namespace tessera
