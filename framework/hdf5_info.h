// What HDF5 this build links: its version and whether it is the parallel (MPI-IO) flavour.
// The dataset and snapshot readers and writers live beside this file.
#pragma once

#include <string>

namespace tessera {

std::string hdf5_version();  // "1.10.8"
bool hdf5_parallel();        // true for Debian's OpenMPI flavour (H5_HAVE_PARALLEL)

}  // namespace tessera
