// Gaussian ownership for sharded 3DGS (docs/distributed.md): Morton codes, cost-balanced contiguous
// ranges of the global Morton order, row migration with all-to-all-v, rebalancing, canonical gather.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace tessera::models::gaussians {

// An axis-aligned scene box. Positions are quantized inside it; outside it they are clamped.
struct SceneBounds {
  double lo[3] = {0.0, 0.0, 0.0};
  double hi[3] = {1.0, 1.0, 1.0};
};

// The box of every rank's `means` (allreduce of min and max), identical on every rank. An empty
// scene gives the unit box. Collective.
SceneBounds global_bounds(distributed::Communicator& comm, const torch::Tensor& means);  // [n, 3]

// Bits per axis of a Morton code: 10 gives 30-bit codes, 21 gives 63-bit codes (the default).
constexpr int kMortonBits30 = 10;
constexpr int kMortonBits63 = 21;

// Morton (Z-order) codes of positions: each axis is quantized to q = floor((x - lo) / (hi - lo) *
// 2^bits) clamped to [0, 2^bits - 1] (a flat axis, hi <= lo, gives 0; NaN gives 0, +inf the top),
// then the bits are interleaved x0 y0 z0 x1 y1 z1 ... from the least significant end. Elementwise,
// on the device of `means`; computed in float64 so float32 and float64 means agree.
torch::Tensor morton_codes(const torch::Tensor& means,  // [N, 3] float32 or float64
                           const SceneBounds& bounds,
                           int bits_per_axis = kMortonBits63);  // 1..21
// -> [N] int64, in [0, 2^(3 bits))

// The balanced split of an ordered sequence of costs into `parts` contiguous ranges: boundary k
// (0 < k < parts) is the prefix position whose prefix sum P[i] = costs[0] + ... + costs[i-1] is
// nearest the target k * total / parts: the first i with P[i] >= target, or i - 1 instead when
// target - P[i-1] <= P[i] - target. Part k is [b[k], b[k+1]); its
// cost differs from total / parts by less than the largest single cost. When the total is 0 every
// cost counts as 1 (an even split by count). Costs must be finite and >= 0 (UserError otherwise).
// Deterministic: identical costs give identical boundaries.
std::vector<int64_t> balanced_boundaries(const torch::Tensor& costs,  // [T] float64 (any float)
                                         int parts);                  // -> [parts + 1]

// Moves rows to new owners, one tensor at a time, so that a caller replacing each tensor as it
// arrives holds at most two copies of one tensor above its rows (not a packed copy of all of them
// sent and another received: at 1M Gaussians with Adam state that was 1.9 KB per Gaussian on top).
// Row i of every tensor goes to rank destination[i]. move() returns the rows this rank receives,
// ordered by (source rank, the row's local order at its source). Tensors may have any dtype (also
// bool and other types the Communicator does not reduce: rows travel as bytes) and any trailing
// shape, with n_local rows (0 allowed). The results are new tensors; a tensor that required grad
// gives a leaf that requires grad. Collective: every rank constructs the migration together and
// moves the same sequence of tensors (dtypes and trailing shapes checked at every move).
class RowMigration {
 public:
  RowMigration(distributed::Communicator& comm,
               const torch::Tensor& destination);  // [n_local] int64 in [0, size)
  // [n_local, *] -> [received_rows(), *]; with `then_order` [received_rows()] int64, a
  // permutation of the received rows (std::logic_error otherwise), they are returned reordered
  // as index_select(0, then_order) would, without a second copy.
  // Wide rows travel in slices of at most 32 bytes, so that what is in flight above the input
  // and the result is two slices of it, not two copies of the tensor.
  torch::Tensor move(const torch::Tensor& tensor, const torch::Tensor& then_order = {});
  int64_t received_rows() const { return received_rows_; }

 private:
  distributed::Communicator& comm_;
  int64_t n_ = 0;
  int64_t received_rows_ = 0;
  torch::Tensor order_;               // local rows sorted by destination (stable)
  std::vector<int64_t> send_counts_;  // rows to each rank
};

// RowMigration over a list: one result per input, in order.
std::vector<torch::Tensor> migrate_rows(
    distributed::Communicator& comm,
    const torch::Tensor& destination,          // [n_local] int64 in [0, size)
    const std::vector<torch::Tensor>& tensors);  // each [n_local, *]

struct RebalanceOptions {
  // Rebalance when max/mean over ranks of the row count or of the summed cost exceeds this.
  double imbalance_threshold = 1.2;
  bool force = false;  // migrate whatever the imbalance
  int bits_per_axis = kMortonBits63;
  // Called once the rows are to move, before the first row moves: the caller drops its other
  // references to the ShardRows' tensors, so that each tensor's old rows are freed as its new
  // rows arrive (rebalance replaces the tensors in ShardRows one at a time).
  std::function<void()> before_moving;
};

// Rows owned by this rank: positions, global ids, per-row costs and everything else that must move
// with them (parameters and their Adam exp_avg / exp_avg_sq, any dtype and trailing shape).
struct ShardRows {
  torch::Tensor means;                 // [n, 3] float32 or float64 (migrated too)
  torch::Tensor global_ids;            // [n] int64, unique over all ranks
  torch::Tensor costs;                 // [n] float64, or undefined for cost 1 per row
  std::vector<torch::Tensor> tensors;  // each [n, *]
};

struct RebalanceReport {
  bool migrated = false;        // rows were migrated (never for an empty scene); same on all ranks
  double count_imbalance = 1.0;  // max/mean of the per-rank row counts before (1 when empty)
  double cost_imbalance = 1.0;   // max/mean of the per-rank summed costs before
  int64_t global_rows = 0;
  int64_t rows_sent = 0;      // rows of this rank that changed owner
  int64_t rows_received = 0;  // rows this rank got from other ranks
};

// The imbalance check and, when it fires, the migration to Morton ownership: every row's key is
// (morton code, global id); rank r receives the r-th contiguous range of the global key order,
// split by balanced_boundaries over the costs in that order (found with a distributed binary
// search, O(log key range) small allreduces, no rank ever holds all keys). Afterwards each rank's
// rows are sorted by key, and the concatenation of the ranks' rows in rank order is the global key
// order, which depends neither on the world size nor on the initial distribution. `rows` is
// replaced by the migrated rows (unchanged when no migration happens). The decision is rank 0's,
// broadcast. Collective.
RebalanceReport rebalance(distributed::Communicator& comm, ShardRows& rows, const SceneBounds& bounds,
                          const RebalanceOptions& options = {});

// The rows of every rank ordered by global id (ascending), for snapshots and PLY export whatever
// the world size. Returns [N, *] on `root`, or on every rank when root < 0; an undefined tensor on
// the other ranks: an allgatherv for every rank, an all-to-all-v that sends only to root for one.
// Throws UserError if a global id appears twice. Collective.
torch::Tensor gather_canonical(distributed::Communicator& comm,
                               const torch::Tensor& global_ids,  // [n] int64
                               const torch::Tensor& tensor,      // [n, *] any dtype
                               int root = 0);

// The first non-empty `local` of any rank, on every rank ("" when none), so that an error one
// rank met (a file it could not write) is thrown on all of them together. Collective.
std::string agreed_error(distributed::Communicator& comm, const std::string& local);

namespace detail {
// Rows as raw bytes, so that any dtype travels through the Communicator's uint8 collectives:
// [n, *] -> [n, row_bytes] uint8 (contiguous), and back to [n, *rest] of `like`'s dtype (a view
// of `bytes` when it is a whole contiguous buffer, else a copy).
torch::Tensor rows_as_bytes(const torch::Tensor& tensor);  // [n, *] -> [n, B] uint8
torch::Tensor bytes_as_rows(const torch::Tensor& bytes,    // [m, B] uint8
                            const torch::Tensor& like);    // [*, *rest] -> [m, *rest]
}  // namespace detail

}  // namespace tessera::models::gaussians
