// capture_rng / restore_rng (see rng_state.h).
#include "framework/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace tessera {

namespace {

torch::Tensor get_generator_state(at::Generator gen) {  // a handle: copies share the impl
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngState capture_rng(const std::vector<c10::Device>& devices) {
  RngState state;
  state.cpu = get_generator_state(at::detail::getDefaultCPUGenerator());
  for (const c10::Device& device : devices)
    if (device.is_cuda())
      state.cuda.emplace_back(
          device, get_generator_state(at::globalContext().defaultGenerator(device)));
  return state;
}

void restore_rng(const RngState& state) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), state.cpu);
  for (const auto& [device, gen_state] : state.cuda)
    set_generator_state(at::globalContext().defaultGenerator(device), gen_state);
}

}  // namespace tessera
