// `tessera --version` and the launcher's rank: the versions of every library this build links,
// and the rank announced by mpirun, srun or a PMI launcher before MPI_Init.
#include <mpi.h>


#include <cstdlib>
#include <sstream>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "distributed/communicator.h"
#include "framework/hdf5_info.h"
#include "launch/commands.h"

namespace tessera::launch {

namespace {
std::string cuda_text() {
#ifdef TESSERA_WITH_CUDA
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  const bool has_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  std::ostringstream out;
  out << runtime / 1000 << "." << runtime % 1000 / 10 << " (driver "
      << (has_driver ? std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10)
                     : std::string("none"))
      << ")";
  return out.str();
#else
  return "none";
#endif
}

std::string mpi_text() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  const size_t comma = version.find(',');  // "Open MPI v4.1.4, package: ..." -> first part
  if (comma != std::string::npos) version.resize(comma);
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  return version;
}
}  // namespace

std::string version_text() {
  std::ostringstream out;
  out << "tessera " << TESSERA_VERSION << "\n"
      << "LibTorch " << TESSERA_TORCH_VERSION << "\n"
      << "CUDA     " << cuda_text() << "\n"
      << "NCCL     " << distributed::nccl_version() << "\n"
      << "MPI      " << mpi_text() << "\n"
      << "HDF5     " << hdf5_version() << (hdf5_parallel() ? " (parallel)" : " (serial)");
  return out.str();
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

}  // namespace tessera::launch
