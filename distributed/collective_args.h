// Argument handling shared by the Communicator backends: row geometry of the variable-size
// collectives, their argument checks, and the division that finishes an average.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "distributed/communicator.h"

namespace tessera::distributed::detail {

// Elements per row: the product of every dimension after the first.
int64_t row_elements(const torch::Tensor& t);
// `t`'s shape with the first dimension replaced by `rows`.
std::vector<int64_t> shape_with_rows(const torch::Tensor& t, int64_t rows);
// Avg is a sum followed by this division (truncating for integers) on every backend.
void finish_avg(torch::Tensor& t, ReduceOp op, int size);
// Throws UserError unless `t` has a first dimension.
void require_rows(const torch::Tensor& t, const char* what);
// Throws UserError unless every rank's row width (`widths`, rank order) equals this rank's.
void require_same_row_width(const std::vector<int64_t>& widths, int64_t mine);
// Throws UserError unless there is one count per rank and they add up to the input's rows.
void require_send_counts(const torch::Tensor& input, const std::vector<int64_t>& send_counts,
                         int size);

}  // namespace tessera::distributed::detail
