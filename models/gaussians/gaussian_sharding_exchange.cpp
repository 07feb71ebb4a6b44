// Tile partition, destination ranks of projected Gaussians, and the differentiable all-to-all-v
// of projected attributes whose backward is the reverse all-to-all-v, and the canonical gather.
#include "models/gaussians/gaussian_sharding_exchange.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "distributed/errors.h"
#include "kernels/cpu/parallel.h"
#include "models/gaussians/gaussian_sharding.h"

namespace tessera::models::gaussians {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError(message);
}

std::vector<int64_t> to_int64s(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kInt64).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Rects per row of tiles are contiguous index intervals; rects per batch are a few rows.
constexpr int64_t kRectsPerTask = 1024;

// Forward: all_to_all_v of the rows; backward: all_to_all_v of their gradients the other way.
class RowExchangeFunction : public torch::autograd::Function<RowExchangeFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& sent,  // [M, *]
                               distributed::Communicator* comm, const std::vector<int64_t>& send_counts) {
    std::vector<int64_t> recv_counts;
    torch::Tensor received = comm->all_to_all_v(sent.contiguous(), send_counts, &recv_counts);
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    ctx->saved_data["recv_counts"] = recv_counts;
    return received;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<distributed::Communicator*>(ctx->saved_data["comm"].toInt());
    const std::vector<int64_t> recv_counts = ctx->saved_data["recv_counts"].toIntVector();
    // v_received [R, *] goes back to the sources: what came from rank s returns to rank s.
    const torch::Tensor v_sent = comm->all_to_all_v(grads[0].contiguous(), recv_counts);
    return {v_sent, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int TilePartition::owner(int64_t tile) const {
  // The last rank whose block starts at or before the tile (skips empty blocks).
  return static_cast<int>(std::upper_bound(starts.begin(), starts.end() - 1, tile) -
                          starts.begin()) - 1;
}

torch::Tensor TilePartition::mask(int rank) const {
  torch::Tensor m = torch::zeros({num_tiles()}, torch::kBool);
  m.narrow(0, begin(rank), end(rank) - begin(rank)).fill_(true);
  return m;
}

torch::Tensor TilePartition::owners() const {
  std::vector<int64_t> sizes(parts());
  for (int r = 0; r < parts(); ++r) sizes[r] = end(r) - begin(r);
  return torch::repeat_interleave(torch::arange(parts(), torch::kInt64),
                                  torch::tensor(sizes, torch::kInt64));
}

TilePartition partition_tiles(const torch::Tensor& tile_cost, int parts) {
  require(tile_cost.dim() == 1, "partition_tiles: tile_cost must be [T]");
  TilePartition p;
  p.starts = balanced_boundaries(tile_cost, parts);
  return p;
}

torch::Tensor tile_rects(const torch::Tensor& means2d, const torch::Tensor& radii, int64_t width,
                         int64_t height, int64_t tile_size) {
  require(means2d.dim() == 2 && means2d.size(1) == 2 && means2d.is_floating_point(),
          "tile_rects: means2d must be [P, 2] float");
  require(radii.dim() == 1 && radii.size(0) == means2d.size(0),
          "tile_rects: radii must be [P] with P the rows of means2d");
  require(tile_size >= 1 && width >= 0 && height >= 0,
          "tile_rects: tile_size must be >= 1 and the image size >= 0");
  const int64_t tiles_x = (width + tile_size - 1) / tile_size;
  const int64_t tiles_y = (height + tile_size - 1) / tile_size;
  const torch::Tensor m = means2d.detach().to(torch::kFloat64);
  const torch::Tensor r = radii.to(m.device(), torch::kFloat64);
  const double ts = static_cast<double>(tile_size);
  // clamp(floor(v), 0, hi) computed in double, as clamp_tile does.
  auto clamp_tile = [](const torch::Tensor& v, int64_t hi) {
    return v.floor().clamp(0.0, static_cast<double>(hi));
  };
  const torch::Tensor mx = m.select(1, 0), my = m.select(1, 1);
  const torch::Tensor valid = (radii.to(m.device()) > 0) & mx.isfinite() & my.isfinite();
  const torch::Tensor mxs = torch::where(valid, mx, torch::zeros_like(mx));
  const torch::Tensor mys = torch::where(valid, my, torch::zeros_like(my));
  const torch::Tensor x0 = clamp_tile((mxs - r) / ts, tiles_x);
  const torch::Tensor x1 = torch::maximum(clamp_tile((mxs + r + ts - 1.0) / ts, tiles_x), x0);
  const torch::Tensor y0 = clamp_tile((mys - r) / ts, tiles_y);
  const torch::Tensor y1 = torch::maximum(clamp_tile((mys + r + ts - 1.0) / ts, tiles_y), y0);
  const torch::Tensor rect = torch::stack({x0, x1, y0, y1}, 1).to(torch::kInt64);
  return torch::where(valid.unsqueeze(1), rect, torch::zeros_like(rect));
}

torch::Tensor destination_ranks(const torch::Tensor& rects, int64_t tiles_x, int64_t first_tile,
                                const TilePartition& partition) {
  require(rects.dim() == 2 && rects.size(1) == 4 && rects.scalar_type() == torch::kInt64,
          "destination_ranks: rects must be [P, 4] int64");
  require(partition.parts() >= 1, "destination_ranks: the partition has no ranks");
  const int parts = partition.parts();
  const int64_t num_tiles = partition.num_tiles();
  const torch::Tensor r = rects.detach().to(torch::kCPU).contiguous();
  const int64_t n = r.size(0);
  torch::Tensor out = torch::zeros({n, parts}, torch::kBool);
  const int64_t* rp = r.data_ptr<int64_t>();
  bool* op = out.data_ptr<bool>();
  tessera::parallel_for(0, n, kRectsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t x0 = rp[4 * p], x1 = rp[4 * p + 1], y0 = rp[4 * p + 2], y1 = rp[4 * p + 3];
      if (x1 <= x0) continue;
      for (int64_t ty = y0; ty < y1; ++ty) {
        // This row of the rect is the tile interval [a, b); blocks are intervals too.
        const int64_t a = std::max<int64_t>(first_tile + ty * tiles_x + x0, 0);
        const int64_t b = std::min<int64_t>(first_tile + ty * tiles_x + x1, num_tiles);
        if (a >= b) continue;
        for (int k = partition.owner(a), last = partition.owner(b - 1); k <= last; ++k)
          if (partition.begin(k) < partition.end(k)) op[p * parts + k] = true;
      }
    }
  });
  return out.to(rects.device());
}

namespace {
// How many rows each source will send this rank, from every rank's send counts. Collective.
std::vector<int64_t> receive_counts(distributed::Communicator& comm,
                                    const std::vector<int64_t>& send_counts) {
  const torch::Tensor counts =
      torch::tensor(send_counts, torch::kInt64).reshape({comm.size(), 1}).to(comm.device());
  const std::vector<int64_t> ones(comm.size(), 1);
  return to_int64s(comm.all_to_all_v(counts, ones));
}
}  // namespace

ExchangePlan make_exchange_plan(distributed::Communicator& comm, const torch::Tensor& destinations) {
  require(destinations.dim() == 2 && destinations.size(1) == comm.size() &&
              destinations.scalar_type() == torch::kBool,
          "make_exchange_plan: destinations must be [P, " + std::to_string(comm.size()) +
              "] bool");
  ExchangePlan plan;
  plan.num_rows = destinations.size(0);
  // Column-major nonzeros: grouped by destination rank, row order within a group.
  const torch::Tensor by_rank = destinations.t().contiguous();
  const torch::Tensor nz = by_rank.nonzero();  // [M, 2] (rank, row), row-major order
  plan.source_rows = nz.select(1, 1).contiguous().to(comm.device());
  plan.send_counts = to_int64s(by_rank.sum(1));
  plan.recv_counts = receive_counts(comm, plan.send_counts);
  return plan;
}

EntryPlan make_entry_plan(distributed::Communicator& comm, const std::vector<torch::Tensor>& rects,
                          const std::vector<int64_t>& tiles_x,
                          const std::vector<int64_t>& first_tile, const TilePartition& partition) {
  require(rects.size() == tiles_x.size() && rects.size() <= first_tile.size(),
          "make_entry_plan: one rect tensor, tiles_x and first tile per view");
  require(partition.parts() == comm.size(), "make_entry_plan: the partition is not the world's");
  const int64_t num_tiles = partition.num_tiles();
  std::vector<torch::Tensor> cpu;
  for (const torch::Tensor& r : rects) {
    require(r.dim() == 2 && r.size(1) == 4 && r.scalar_type() == torch::kInt64,
            "make_entry_plan: rects must be [P, 4] int64");
    cpu.push_back(r.detach().to(torch::kCPU).contiguous());
  }
  // A counting sort by tile: count each tile's rows, then place rows in row order.
  std::vector<int64_t> start(static_cast<size_t>(num_tiles) + 1, 0);
  auto each_entry = [&](auto&& visit) {
    int64_t row = 0;
    for (size_t v = 0; v < cpu.size(); ++v) {
      const int64_t* rp = cpu[v].data_ptr<int64_t>();
      for (int64_t p = 0; p < cpu[v].size(0); ++p, ++row, rp += 4)
        for (int64_t ty = rp[2]; ty < rp[3]; ++ty)
          for (int64_t tx = rp[0]; tx < rp[1]; ++tx)
            visit(row, first_tile[v] + ty * tiles_x[v] + tx);
    }
    return row;
  };
  const int64_t rows = each_entry([&](int64_t, int64_t tile) { ++start[tile + 1]; });
  for (int64_t t = 0; t < num_tiles; ++t) start[t + 1] += start[t];
  const int64_t entries = start[num_tiles];
  EntryPlan out;
  torch::Tensor source = torch::empty({entries}, torch::kInt64);
  out.tiles = torch::empty({entries}, torch::kInt64);
  {
    int64_t* sp = source.data_ptr<int64_t>();
    int64_t* tp = out.tiles.data_ptr<int64_t>();
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    each_entry([&](int64_t row, int64_t tile) {
      sp[cursor[tile]] = row;
      tp[cursor[tile]++] = tile;
    });
  }
  out.plan.num_rows = rows;
  out.plan.source_rows = source.to(comm.device());
  for (int r = 0; r < partition.parts(); ++r)
    out.plan.send_counts.push_back(start[partition.end(r)] - start[partition.begin(r)]);
  out.plan.recv_counts = receive_counts(comm, out.plan.send_counts);
  return out;
}

torch::Tensor all_to_all_rows(distributed::Communicator& comm, const torch::Tensor& sent,
                              const std::vector<int64_t>& send_counts) {
  require(sent.dim() >= 1 && sent.is_floating_point(),
          "all_to_all_rows: sent must be [M, *] floating point");
  return RowExchangeFunction::apply(sent, &comm, send_counts);
}

torch::Tensor exchange_projected(distributed::Communicator& comm, const ExchangePlan& plan,
                                 const torch::Tensor& rows) {
  require(rows.dim() >= 1 && rows.size(0) == plan.num_rows,
          "exchange_projected: rows must be [P, *] with P = " + std::to_string(plan.num_rows) +
              " (the plan's rows)");
  // index_select's backward is the index_add that sums a row's gradients over its copies.
  const torch::Tensor sent = rows.index_select(0, plan.source_rows.to(rows.device()));
  return all_to_all_rows(comm, sent, plan.send_counts);
}

torch::Tensor accumulate_to_sources(const torch::Tensor& v_sent, const torch::Tensor& source_rows,
                                    int64_t num_rows) {
  require(v_sent.dim() >= 1 && source_rows.dim() == 1 && v_sent.size(0) == source_rows.size(0),
          "accumulate_to_sources: v_sent must be [M, *] and source_rows [M]");
  std::vector<int64_t> shape = v_sent.sizes().vec();
  shape[0] = num_rows;
  return torch::zeros(shape, v_sent.options())
      .index_add_(0, source_rows.to(v_sent.device()), v_sent);
}

torch::Tensor exchange_with_plan(distributed::Communicator& comm, const ExchangePlan& plan,
                                 const torch::Tensor& tensor) {
  require(tensor.dim() >= 1 && tensor.size(0) == plan.num_rows,
          "exchange_with_plan: tensor must be [P, *] with P = " + std::to_string(plan.num_rows));
  const torch::Tensor sent =
      detail::rows_as_bytes(tensor.detach().index_select(0, plan.source_rows.to(tensor.device())));
  return detail::bytes_as_rows(comm.all_to_all_v(sent, plan.send_counts), tensor);
}

torch::Tensor received_from(const ExchangePlan& plan) {
  return torch::repeat_interleave(torch::arange(static_cast<int64_t>(plan.recv_counts.size())),
                                  torch::tensor(plan.recv_counts, torch::kInt64));
}

torch::Tensor gather_canonical(distributed::Communicator& comm, const torch::Tensor& global_ids,
                               const torch::Tensor& tensor, int root) {
  require(global_ids.dim() == 1 && global_ids.scalar_type() == torch::kInt64,
          "gather_canonical: global_ids must be [n] int64");
  require(tensor.dim() >= 1 && tensor.size(0) == global_ids.size(0),
          "gather_canonical: tensor must have one row per global id");
  torch::Tensor ids, bytes;
  if (root < 0) {
    ids = comm.allgatherv(global_ids.to(comm.device()));
    bytes = comm.allgatherv(detail::rows_as_bytes(tensor));
  } else {
    // A gather: every rank's rows to root alone (an all-to-all-v that sends nothing elsewhere),
    // so the others neither receive nor hold the set.
    std::vector<int64_t> counts(static_cast<size_t>(comm.size()), 0);
    counts.at(static_cast<size_t>(root)) = global_ids.size(0);
    ids = comm.all_to_all_v(global_ids.to(comm.device()), counts);
    bytes = comm.all_to_all_v(detail::rows_as_bytes(tensor), counts);
    if (comm.rank() != root) return {};
  }
  const auto sorted = ids.sort(/*stable=*/true, 0, false);
  const torch::Tensor& sorted_ids = std::get<0>(sorted);
  if (sorted_ids.size(0) > 1) {
    const int64_t duplicates =
        (sorted_ids.narrow(0, 1, sorted_ids.size(0) - 1) ==
         sorted_ids.narrow(0, 0, sorted_ids.size(0) - 1)).sum().item<int64_t>();
    require(duplicates == 0, "gather_canonical: " + std::to_string(duplicates) +
                                 " global ids appear on more than one row");
  }
  return detail::bytes_as_rows(bytes.index_select(0, std::get<1>(sorted)), tensor);
}

}  // namespace tessera::models::gaussians
