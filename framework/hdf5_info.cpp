// Version and flavour of the linked HDF5 library, for `tessera --version` and snapshot writers.
#include "framework/hdf5_info.h"

#include <hdf5.h>

namespace tessera {

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

bool hdf5_parallel() {
#ifdef H5_HAVE_PARALLEL
  return true;
#else
  return false;
#endif
}

}  // namespace tessera
