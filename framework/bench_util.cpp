// Shared pieces of the bench commands (bench_util.h).
#include "framework/bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <system_error>

#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/memory.h"
#include "framework/data/synth.h"

namespace tessera::bench {

double median(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median of nothing");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double max_over_ranks(MPI_Comm comm, double value) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, comm));
  return value;
}

double sum_over_ranks(MPI_Comm comm, double value) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm));
  return value;
}

std::string phases_json(const PhaseTimes& phases) {
  std::string out = "{";
  char item[128];
  for (const auto& [phase, seconds] : phases) {
    std::snprintf(item, sizeof(item), "%s\"%s\":%.6g", out.size() > 1 ? "," : "", phase.c_str(),
                  seconds);
    out += item;
  }
  return out + "}";
}

void sync(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

TempDir::TempDir(const std::string& name) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / ("tessera-bench-" + name + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error("bench " + name + ": cannot create a temporary folder in " +
                             std::filesystem::temp_directory_path().string());
  path = tmpl;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

torch::Device bench_device(const distributed::ProcessContext& context, const std::string& option,
                           const std::string& bench) {
  const bool cuda = option == "cuda" || (option == "auto" && context.one_cuda_device_per_rank());
  if (cuda && !context.one_cuda_device_per_rank())
    throw UserError("bench " + bench + " --device cuda: needs one CUDA device per rank on each node (" +
                    std::to_string(context.info().local_size) + " ranks here, " +
                    std::to_string(torch::cuda::device_count()) + " devices visible)");
  if (!cuda) {
    install_counting_cpu_allocator();
    return torch::Device(torch::kCPU);
  }
  return torch::Device(torch::kCUDA, context.cuda_device_index());
}

std::string bench_scene(const std::string& name, int rank, const std::string& scene,
                        const std::string& preset, int views, int size, uint64_t seed,
                        std::unique_ptr<TempDir>& temp) {
  if (!scene.empty()) return scene;
  temp = std::make_unique<TempDir>(name);
  const std::string path = (temp->path / "scene.h5").string();
  data::synth::SynthOptions synth;
  synth.preset = preset;
  synth.views = views;
  synth.width = synth.height = size;
  synth.seed = seed;
  progress(rank, name.c_str(), "synthesizing '%s': %d views of %dx%d", synth.preset.c_str(),
           synth.views, synth.width, synth.height);
  data::synth::write_synth_scene(synth, path);
  return path;
}

}  // namespace tessera::bench
