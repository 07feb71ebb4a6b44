# Tests and benchmarks of the differentiable ops in kernels/ (included from tests/CMakeLists.txt).
# CUDA cases inside each test skip cleanly where no GPU is visible.
tessera_add_test(test_volume_render SOURCES test_volume_render.cpp LIBS tessera_kernels LABELS cuda)

# Google Benchmark binaries: run by hand (build/tests/bench_<op>), not by CTest.
find_package(benchmark REQUIRED)
add_executable(bench_volume_render bench/bench_volume_render.cpp)
target_link_libraries(bench_volume_render PRIVATE
  tessera_kernels benchmark::benchmark benchmark::benchmark_main tessera_options)
tessera_use_pch(bench_volume_render)
