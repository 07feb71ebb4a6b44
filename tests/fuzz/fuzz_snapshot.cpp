// Fuzz target: the snapshot reader and validator (framework/snapshot.h, docs/formats.md).
// Input: the bytes of an HDF5 file. Checks: validate_snapshot names a problem or none; a file it
// passes opens, verifies and reads every dataset (shape and dtype as listed); for a file it
// refuses, SnapshotReader refuses to open it or verify() names a problem too, so that resume
// never loads it. Every other outcome is UserError.
#include "framework/snapshot.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string path = fuzz::scratch_dir() + "/step-00000001.h5";
  fuzz::write_bytes(path, data, size);
  std::string problem;
  if (!fuzz::accepts("validate_snapshot", [&] { problem = validate_snapshot(path); }))
    fuzz::finding("validate_snapshot threw instead of naming the problem");
  std::unique_ptr<SnapshotReader> reader;
  if (!fuzz::accepts("SnapshotReader", [&] { reader = std::make_unique<SnapshotReader>(path); })) {
    if (problem.empty()) fuzz::finding("validate_snapshot passed a file SnapshotReader refuses");
    return 0;
  }
  std::string verified;
  if (!fuzz::accepts("verify", [&] { verified = reader->verify(); }))
    fuzz::finding("SnapshotReader::verify threw instead of naming the problem");
  if (verified.empty() != problem.empty())
    fuzz::finding("validate_snapshot says \"" + problem + "\", verify says \"" + verified + "\"");
  bool all_read = true;
  for (const std::string& name : reader->names()) {
    const bool read = fuzz::accepts("read", [&] {
      const torch::Tensor t = reader->read(name);
      if (t.sizes().vec() != reader->shape(name) || t.scalar_type() != reader->dtype(name))
        fuzz::finding(name + " reads as " + c10::str(t.sizes(), " ", t.scalar_type()) +
                      ", listed as " + c10::str(at::IntArrayRef(reader->shape(name)), " ",
                                                reader->dtype(name)));
    });
    if (read && !reader->shape(name).empty() && reader->shape(name)[0] > 0)
      fuzz::accepts("read_rows", [&] { (void)reader->read_rows(name, 0, 1); });
    all_read = all_read && read;
  }
  if (problem.empty() && !all_read) fuzz::finding("a snapshot that validates has an unreadable dataset");
  return 0;
}
