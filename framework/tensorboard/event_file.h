// A TensorBoard event file (rank 0 of a run writes RUN_DIR/tensorboard; docs/training_loop.md,
// "TensorBoard"): records are TFRecords (uint64 length, masked CRC-32C of it, a protobuf Event of
// the schema in event.proto, masked CRC-32C of it). This library does not see torch's headers:
// torch ships protobuf headers of another version than Debian's libprotobuf-lite, which it links
// statically. Images come in as PNG bytes (framework/data/image_io.h, encode_png_unit).
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera {

// CRC-32C (Castagnoli) of `size` bytes, and the masked form TFRecord stores.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardEventFile {
 public:
  // A new file DIR/events.out.tfevents.<unix seconds>.<host>.<pid> (DIR is created). A run
  // resumed from step `resumed_step` > 0 first writes a restart marker at resumed_step + 1, so
  // that readers drop what an earlier process wrote for later steps, as metrics.jsonl drops
  // them. Throws UserError when the file cannot be created.
  TensorBoardEventFile(const std::string& dir, int64_t resumed_step);

  const std::string& path() const { return path_; }

  // Each call appends one event and flushes it, so `tensorboard --logdir` follows the run. A
  // write that fails (disk full) logs one warning and nothing more is written; training goes on.

  // Every number of `record` (booleans as 0/1) as a scalar under its key, a nested object's under
  // "key/inner"; strings, arrays and nulls are left out. Scalars are float32, as TensorBoard's are.
  void scalars(const nlohmann::json& record, int64_t step);
  // An RGB image given as the bytes of a PNG file of that size.
  void image(const std::string& tag, int64_t step, int64_t height, int64_t width,
             const std::string& png);
  // Markdown text (TensorBoard's text dashboard).
  void text(const std::string& tag, int64_t step, const std::string& markdown);

 private:
  void write_event(const std::string& event_bytes);

  std::string path_;
  std::ofstream out_;
  bool failed_ = false;  // a write failed: warned once, nothing more is written
};

}  // namespace tessera
