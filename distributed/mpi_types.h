// Mapping from torch dtypes and ReduceOps to MPI datatypes and operations, including the
// user-defined ones for bfloat16 and float16 that MPI lacks.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include "distributed/communicator.h"

namespace tessera::distributed {

// The MPI datatype of one element of `dtype`; throws UserError for an unsupported dtype.
MPI_Datatype mpi_datatype(torch::ScalarType dtype);
// The MPI operation reducing `dtype` with `op` (Avg maps to sum; the caller divides).
MPI_Op mpi_op(torch::ScalarType dtype, ReduceOp op);
// Creates the user-defined types and ops; called once after MPI_Init, freed by release.
void create_mpi_types();
void release_mpi_types();

}  // namespace tessera::distributed
