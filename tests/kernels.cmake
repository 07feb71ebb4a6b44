# Tests and benchmarks of the differentiable ops in kernels/ (included from tests/CMakeLists.txt).
# CUDA cases inside each test skip cleanly where no GPU is visible.
tessera_add_test(test_parallel SOURCES test_parallel.cpp LIBS tessera_kernels LABELS threads)
tessera_add_test(test_volume_render SOURCES test_volume_render.cpp LIBS tessera_kernels LABELS cuda threads)
tessera_add_test(test_hash_encoding SOURCES test_hash_encoding.cpp LIBS tessera_kernels LABELS cuda threads)
tessera_add_test(test_ray_march SOURCES test_ray_march.cpp LIBS tessera_kernels LABELS cuda threads)

# Google Benchmark binaries: run by hand (build/tests/bench_<op>), not by CTest.
find_package(benchmark REQUIRED)
foreach(op volume_render hash_encoding ray_march gaussian_projection gaussian_rasterize fixed_point)
  add_executable(bench_${op} bench/bench_${op}.cpp)
  target_link_libraries(bench_${op} PRIVATE
    tessera_kernels benchmark::benchmark benchmark::benchmark_main tessera_options)
  tessera_use_pch(bench_${op})
endforeach()

# 3D Gaussian splatting ops: projection with EWA splatting, spherical harmonics (below: their
# tests), tile binning and rasterization (further below).
# -- projection and spherical harmonics --
tessera_add_test(test_gaussian_projection SOURCES test_gaussian_projection.cpp LIBS tessera_kernels
                 LABELS cuda threads)
tessera_add_test(test_spherical_harmonics SOURCES test_spherical_harmonics.cpp LIBS tessera_kernels
                 LABELS cuda threads)
# -- tile binning and rasterization --
tessera_add_test(test_tile_binning SOURCES test_tile_binning.cpp LIBS tessera_kernels LABELS cuda threads)
tessera_add_test(test_gaussian_rasterize SOURCES test_gaussian_rasterize.cpp LIBS tessera_kernels
                 LABELS cuda threads)
