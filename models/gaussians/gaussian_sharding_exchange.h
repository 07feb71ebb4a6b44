// Image-space side of sharded 3DGS (docs/distributed.md): cost-balanced contiguous tile blocks per
// rank, the ranks each projected Gaussian must reach, and the differentiable all-to-all-v exchange.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "distributed/communicator.h"

namespace tessera::models::gaussians {

// Rank r renders the tiles [starts[r], starts[r + 1]) of the batch's tile sequence: the row-major
// tiles (kernels/tile_binning.h) of view 0, then those of view 1, and so on. Blocks are contiguous
// and may be empty (more ranks than tiles, or cost concentrated in few tiles).
struct TilePartition {
  std::vector<int64_t> starts;  // [parts + 1], starts[0] = 0, starts[parts] = T, non-decreasing

  int parts() const { return static_cast<int>(starts.size()) - 1; }
  int64_t num_tiles() const { return starts.back(); }
  int64_t begin(int rank) const { return starts[rank]; }
  int64_t end(int rank) const { return starts[rank + 1]; }
  // The owner of tile t in [0, T).
  int owner(int64_t tile) const;
  torch::Tensor mask(int rank) const;  // -> [T] bool, true on the rank's block (CPU)
  torch::Tensor owners() const;        // -> [T] int64, the owner of every tile (CPU)
};

// Splits the tiles into `parts` contiguous blocks of balanced cost with balanced_boundaries
// (distributed/gaussian_sharding.h): a greedy prefix-sum split, each block within one tile's cost
// of the mean, an even split by tile count when every cost is 0. Local and deterministic: ranks
// that pass identical costs (e.g. allreduced per-tile intersection counts or timings) get the
// identical partition.
TilePartition partition_tiles(const torch::Tensor& tile_cost,  // [T] float64, >= 0
                              int parts);

// The tile rect [x0, x1) x [y0, y1) of each projected Gaussian, by the getRect rule of
// kernels/gaussian_raster_math.h (same arithmetic, in float64): x0 = clamp(floor((mx - r) / ts),
// 0, tiles_x), x1 = clamp(floor((mx + r + ts - 1) / ts), 0, tiles_x), likewise y; empty (all 0)
// for radius <= 0 or a non-finite centre. Give culled Gaussians radius 0.
torch::Tensor tile_rects(const torch::Tensor& means2d,  // [P, 2] float32/float64 pixels (x, y)
                         const torch::Tensor& radii,    // [P] int32
                         int64_t width, int64_t height, int64_t tile_size);
// -> [P, 4] int64 (x0, x1, y0, y1)

// Which ranks' blocks each rect touches: rect p covers the batch tiles first_tile + ty * tiles_x +
// tx for tx in [x0, x1), ty in [y0, y1) (first_tile: the index of this view's tile 0 in the
// batch). A rect over blocks of two ranks goes to both; an empty rect to none.
torch::Tensor destination_ranks(const torch::Tensor& rects,  // [P, 4] int64 from tile_rects
                                int64_t tiles_x, int64_t first_tile,
                                const TilePartition& partition);
// -> [P, parts] bool, on the device of rects

// What this rank sends in one exchange, and what it gets back.
struct ExchangePlan {
  // [M] int64: the local projected row each sent row copies; grouped by destination rank (rank 0
  // first), each group in local row order. A row sent to k ranks appears k times.
  torch::Tensor source_rows;
  std::vector<int64_t> send_counts;  // [size] rows sent to each rank
  std::vector<int64_t> recv_counts;  // [size] rows received from each rank
  int64_t num_rows = 0;              // P, the local projected rows the plan indexes
};

// The plan for a destination mask (from destination_ranks; several views' masks concatenated
// along P give one plan for the batch). Collective: exchanges the row counts.
ExchangePlan make_exchange_plan(distributed::Communicator& comm,
                                const torch::Tensor& destinations);  // [P, size] bool

// The bitwise path's plan (run.deterministic; docs/training_loop.md, "Bitwise at any world
// size"): one sent row per (tile, projected row) intersection, to the tile's owner, the sent rows
// ordered by batch tile and then by row. Each tile's owner then rasterizes rows that belong to
// that tile alone, so the rasterizer's gradient of a sent row is that one tile's contribution;
// the backward's index_add (exchange_projected) adds a row's tiles in tile order, the order of one
// rank's whole-image sum, whatever the partition. `rects` are each view's rows' tile rects
// (tile_rects), the views' rows numbered one after the other.
struct EntryPlan {
  ExchangePlan plan;
  torch::Tensor tiles;  // [M] int64 (CPU): each sent row's batch tile
};
EntryPlan make_entry_plan(distributed::Communicator& comm, const std::vector<torch::Tensor>& rects,
                          const std::vector<int64_t>& tiles_x,
                          const std::vector<int64_t>& first_tile, const TilePartition& partition);

// The projected-attribute exchange, differentiable: returns [R, *] = the rows every rank sent
// here, from rank 0's first (each source's in its plan order). Backward runs the reverse
// all-to-all-v: each source gets back exactly the gradients of the rows it sent, and a row sent
// to several ranks receives the sum of their gradients (index_add through source_rows).
// Collective in forward AND backward: every rank's loss must depend on its received rows (add
// 0 * received.sum() if a rank has nothing to render), and `rows` must require grad on every rank
// or on none, so that the reverse all-to-all-v runs everywhere. No double backward.
torch::Tensor exchange_projected(distributed::Communicator& comm, const ExchangePlan& plan,
                                 const torch::Tensor& rows);  // [P, *] float -> [R, *]

// The raw differentiable op under exchange_projected: `sent` [M, *] (floating point), its first
// send_counts[0] rows to rank 0 and so on; returns [R, *]. Its backward returns [M, *]: the
// gradients of the sent rows, not yet summed per source row (see accumulate_to_sources).
torch::Tensor all_to_all_rows(distributed::Communicator& comm, const torch::Tensor& sent,  // [M, *]
                              const std::vector<int64_t>& send_counts);       // [size]

// Sums the gradients of sent rows into their source rows: out[source_rows[i]] += v_sent[i].
torch::Tensor accumulate_to_sources(const torch::Tensor& v_sent,       // [M, *]
                                    const torch::Tensor& source_rows,  // [M] int64
                                    int64_t num_rows);                 // -> [num_rows, *]

// Side data of the exchanged rows (global ids, view index, rects: any dtype), sent by the same
// plan, not differentiated. Collective.
torch::Tensor exchange_with_plan(distributed::Communicator& comm, const ExchangePlan& plan,
                                 const torch::Tensor& tensor);  // [P, *] -> [R, *]

// The source rank of every received row: [R] int64 (on the CPU).
torch::Tensor received_from(const ExchangePlan& plan);

}  // namespace tessera::models::gaussians
