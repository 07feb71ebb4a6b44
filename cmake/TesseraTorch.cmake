# Finds LibTorch inside the Python `torch` wheel and defines the imported target tessera::torch.
# The wheel is located through TESSERA_PYTHON (default: .venv/bin/python, else python3).
#
# We import the libraries by hand instead of find_package(Torch): TorchConfig insists on a CUDA
# toolkit whenever the wheel was built with CUDA, and our build must also work without one
# (CPU-only, linking libtorch_cpu alone).

if(NOT TESSERA_PYTHON)
  if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(TESSERA_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(TESSERA_PYTHON NAMES python3 python REQUIRED)
  endif()
endif()
set(TESSERA_PYTHON "${TESSERA_PYTHON}" CACHE FILEPATH "Python interpreter whose torch wheel provides LibTorch")

execute_process(
  COMMAND "${TESSERA_PYTHON}" -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_out
  RESULT_VARIABLE _torch_rc
  ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "Cannot import torch with ${TESSERA_PYTHON}:\n${_torch_err}\n"
                      "Run launch/setup, or pass -DTESSERA_PYTHON=/path/to/python with torch installed.")
endif()
string(REPLACE "\n" ";" _torch_out "${_torch_out}")
list(GET _torch_out 0 TORCH_ROOT)
list(GET _torch_out 1 TORCH_VERSION)
list(GET _torch_out 2 TORCH_CXX11_ABI)
list(LENGTH _torch_out _n)
set(TORCH_CUDA_VERSION "")
if(_n GREATER 3)
  list(GET _torch_out 3 TORCH_CUDA_VERSION)
endif()
message(STATUS "LibTorch ${TORCH_VERSION} (CUDA ${TORCH_CUDA_VERSION}) from ${TORCH_ROOT}")

set(_torch_lib "${TORCH_ROOT}/lib")
add_library(tessera_torch INTERFACE)
add_library(tessera::torch ALIAS tessera_torch)
# The wheel ships its own {fmt} (v12) in include/fmt, which would shadow the system {fmt} that
# Debian's spdlog is built against (v9). A one-entry folder that links to the system fmt goes
# first; {fmt}'s versioned inline namespaces keep the two apart at link time.
find_package(fmt REQUIRED)
get_target_property(_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
list(GET _fmt_include 0 _fmt_include)
set(_fmt_shim "${CMAKE_BINARY_DIR}/fmt-shim")
file(MAKE_DIRECTORY "${_fmt_shim}")
file(CREATE_LINK "${_fmt_include}/fmt" "${_fmt_shim}/fmt" SYMBOLIC)
target_include_directories(tessera_torch SYSTEM INTERFACE
  "${_fmt_shim}" "${TORCH_ROOT}/include" "${TORCH_ROOT}/include/torch/csrc/api/include")
target_compile_definitions(tessera_torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI}
  TESSERA_TORCH_VERSION="${TORCH_VERSION}")
# libtorch.so exports copies of some libstdc++ symbols (std::filesystem among them) that are not
# usable from outside it; with libstdc++ first among the needed libraries, the dynamic linker
# binds our calls to the real ones.
target_link_libraries(tessera_torch INTERFACE
  "-Wl,--push-state,--no-as-needed" stdc++ "-Wl,--pop-state"
  "${_torch_lib}/libtorch.so" "${_torch_lib}/libtorch_cpu.so" "${_torch_lib}/libc10.so")
target_link_options(tessera_torch INTERFACE "-Wl,-rpath,${_torch_lib}")

# Whether the wheel can drive CUDA: it ships libtorch_cuda.so.
set(TORCH_HAS_CUDA OFF)
if(EXISTS "${_torch_lib}/libtorch_cuda.so" AND TORCH_CUDA_VERSION)
  set(TORCH_HAS_CUDA ON)
endif()

# Adds the CUDA half of LibTorch to tessera::torch (called once CUDA is enabled).
function(tessera_torch_add_cuda)
  # One CUDA runtime per process, the wheel's: libtorch_cuda loads libcudart from the wheel's
  # nvidia/cuXX/lib, and a binary that named the toolkit's (another minor version, perhaps newer
  # than the driver) first would have torch run on that one. The toolkit's serves only where the
  # wheel has none. CMAKE_CUDA_RUNTIME_LIBRARY is None (CMakeLists.txt): no cudart_static either.
  file(GLOB _wheel_cudart "${TORCH_ROOT}/../nvidia/cu*/lib/libcudart.so.*"
                          "${TORCH_ROOT}/../nvidia/cuda_runtime/lib/libcudart.so.*")
  if(_wheel_cudart)
    list(GET _wheel_cudart 0 _cudart)
    get_filename_component(_cudart_dir "${_cudart}" DIRECTORY)
    target_link_options(tessera_torch INTERFACE "-Wl,-rpath,${_cudart_dir}")
    message(STATUS "CUDA runtime: ${_cudart} (the torch wheel's)")
  else()
    set(_cudart CUDA::cudart)
    message(STATUS "CUDA runtime: the toolkit's (the torch wheel has none of its own)")
  endif()
  # --no-as-needed: libtorch_cuda registers the CUDA backend from static initializers, so it must
  # stay linked even though few of its symbols are named directly.
  target_link_libraries(tessera_torch INTERFACE
    "-Wl,--no-as-needed" "${_torch_lib}/libtorch_cuda.so" "${_torch_lib}/libc10_cuda.so" "-Wl,--as-needed"
    ${_cudart})
  # The toolkit's headers (cuda_runtime_api.h, which torch's CUDA headers include too).
  target_include_directories(tessera_torch SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(tessera_torch INTERFACE USE_CUDA=1)
endfunction()

# NCCL: we use the one from the torch wheel (the nvidia-nccl wheel next to it), which is the
# library libtorch_cuda already loads, so a process never holds two NCCLs.
function(tessera_find_nccl out_target)
  execute_process(
    COMMAND "${TESSERA_PYTHON}" -c
      "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])"
    OUTPUT_VARIABLE _nccl_root RESULT_VARIABLE _rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_nccl_root}/include/nccl.h")
    message(STATUS "NCCL: the torch wheel's nvidia-nccl package was not found; NCCL backend off")
    set(${out_target} "" PARENT_SCOPE)
    return()
  endif()
  file(GLOB _nccl_lib "${_nccl_root}/lib/libnccl.so*")
  list(GET _nccl_lib 0 _nccl_lib)
  add_library(tessera_nccl INTERFACE)
  target_include_directories(tessera_nccl SYSTEM INTERFACE "${_nccl_root}/include")
  target_link_libraries(tessera_nccl INTERFACE "${_nccl_lib}")
  get_filename_component(_nccl_dir "${_nccl_lib}" DIRECTORY)
  target_link_options(tessera_nccl INTERFACE "-Wl,-rpath,${_nccl_dir}")
  message(STATUS "NCCL: ${_nccl_lib}")
  set(${out_target} tessera_nccl PARENT_SCOPE)
endfunction()
