// Gaussian ownership: Morton codes, balanced splits, row migration, rebalancing by a distributed
// binary search over the global (morton, global id) order.
#include "models/gaussians/gaussian_sharding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "distributed/agreement.h"
#include "distributed/errors.h"

namespace tessera::models::gaussians {

namespace detail {

torch::Tensor rows_as_bytes(const torch::Tensor& tensor) {
  const int64_t n = tensor.size(0);
  int64_t elems = 1;
  for (int64_t d = 1; d < tensor.dim(); ++d) elems *= tensor.size(d);
  if (elems == 0 || n == 0)
    return torch::empty({n, elems * static_cast<int64_t>(tensor.element_size())},
                        tensor.options().dtype(torch::kUInt8));
  return tensor.detach().contiguous().reshape({n, elems}).view(torch::kUInt8);
}

torch::Tensor bytes_as_rows(const torch::Tensor& bytes, const torch::Tensor& like) {
  std::vector<int64_t> shape = like.sizes().vec();
  shape[0] = bytes.size(0);
  if (bytes.numel() == 0) return torch::empty(shape, like.options().requires_grad(false));
  // A whole contiguous buffer is reinterpreted in place; a narrowed or single-row view may keep
  // strides or an offset that view(dtype) rejects, so it is copied into a fresh one.
  if (bytes.is_contiguous() && bytes.storage_offset() == 0)
    return bytes.view(like.scalar_type()).reshape(shape);
  torch::Tensor packed = torch::empty(bytes.sizes(), bytes.options());
  packed.copy_(bytes);
  return packed.view(like.scalar_type()).reshape(shape);
}

}  // namespace detail

namespace {

constexpr int64_t kMaxKey = std::numeric_limits<int64_t>::max();

// A row's place in the global order: (morton code, global id), compared lexicographically.
using Key = std::pair<int64_t, int64_t>;

std::vector<double> to_doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}
std::vector<int64_t> to_int64s(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kInt64).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Spreads the low 21 bits of v so that bit b lands at bit 3b.
torch::Tensor spread_bits(torch::Tensor v) {
  static const int64_t kMasks[5] = {0x1f00000000ffffLL, 0x1f0000ff0000ffLL, 0x100f00f00f00f00fLL,
                                    0x10c30c30c30c30c3LL, 0x1249249249249249LL};
  static const int64_t kShifts[5] = {32, 16, 8, 4, 2};
  v = v.bitwise_and(0x1fffffLL);
  for (int i = 0; i < 5; ++i)
    v = v.bitwise_or(torch::bitwise_left_shift(v, kShifts[i])).bitwise_and(kMasks[i]);
  return v;
}

// The permutation that sorts rows by (code, id): a stable sort by id, then a stable sort by code.
torch::Tensor key_order(const torch::Tensor& codes, const torch::Tensor& ids) {
  const torch::Tensor by_id = std::get<1>(ids.sort(/*stable=*/true, 0, false));
  const torch::Tensor by_code =
      std::get<1>(codes.index_select(0, by_id).sort(/*stable=*/true, 0, false));
  return by_id.index_select(0, by_code);
}

// Iterations of a bisection that shrinks [lo, hi] to one value.
int bisection_steps(int64_t lo, int64_t hi) {
  int steps = 0;
  for (uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo); span > 0; span >>= 1)
    ++steps;
  return steps;
}

// This rank's rows sorted by key, with their cost prefix sums, for the distributed search.
struct LocalKeys {
  std::vector<Key> keys;     // [n] ascending
  std::vector<double> prefix;  // [n + 1] prefix[i] = cost of keys[0..i)
  double cost_le(const Key& k) const {  // cost of rows with key <= k
    return prefix[std::upper_bound(keys.begin(), keys.end(), k) - keys.begin()];
  }
  double cost_lt(const Key& k) const {  // cost of rows with key < k
    return prefix[std::lower_bound(keys.begin(), keys.end(), k) - keys.begin()];
  }
};

// Sums one value per target over the ranks.
std::vector<double> allreduce_sum(distributed::Communicator& comm, const std::vector<double>& values) {
  torch::Tensor t = torch::tensor(values, torch::kFloat64).to(comm.device());
  comm.allreduce(t, distributed::ReduceOp::Sum);
  return to_doubles(t);
}

// The first key of ranks 1..size-1 in the global key order, split as balanced_boundaries splits
// the costs in that order. Bisection first on the code, then on the id within that code; every
// rank runs the same number of steps, and rank 0's result is broadcast.
std::vector<Key> start_keys(distributed::Communicator& comm, const LocalKeys& local, double total) {
  const int parts = comm.size();
  if (parts == 1) return {};
  // Global extremes of codes and ids bound the bisections (exact integer allreduces).
  int64_t lo_c = kMaxKey, hi_c = 0, lo_id = kMaxKey, hi_id = 0;
  for (const Key& k : local.keys) {
    lo_c = std::min(lo_c, k.first), hi_c = std::max(hi_c, k.first);
    lo_id = std::min(lo_id, k.second), hi_id = std::max(hi_id, k.second);
  }
  torch::Tensor mins = torch::tensor({lo_c, lo_id}, torch::kInt64).to(comm.device());
  torch::Tensor maxs = torch::tensor({hi_c, hi_id}, torch::kInt64).to(comm.device());
  comm.allreduce(mins, distributed::ReduceOp::Min);
  comm.allreduce(maxs, distributed::ReduceOp::Max);
  const std::vector<int64_t> mn = to_int64s(mins), mx = to_int64s(maxs);

  const int m = parts - 1;
  std::vector<double> target(m);
  for (int k = 1; k < parts; ++k) target[k - 1] = total * k / parts;
  std::vector<int64_t> lo(m, mn[0]), hi(m, mx[0]);
  std::vector<double> local_values(m);
  // Phase 1: the smallest code C with cost(code <= C) >= target.
  for (int step = bisection_steps(mn[0], mx[0]); step > 0; --step) {
    for (int k = 0; k < m; ++k)
      local_values[k] = local.cost_le({lo[k] + (hi[k] - lo[k]) / 2, kMaxKey});
    const std::vector<double> global = allreduce_sum(comm, local_values);
    for (int k = 0; k < m; ++k) {
      const int64_t mid = lo[k] + (hi[k] - lo[k]) / 2;
      if (global[k] >= target[k]) hi[k] = mid; else lo[k] = std::min(mid + 1, hi[k]);
    }
  }
  const std::vector<int64_t> code = lo;
  // Phase 2: within that code, the smallest id G with cost(key <= (C, G)) >= target.
  std::fill(lo.begin(), lo.end(), mn[1]);
  std::fill(hi.begin(), hi.end(), mx[1]);
  for (int step = bisection_steps(mn[1], mx[1]); step > 0; --step) {
    for (int k = 0; k < m; ++k)
      local_values[k] = local.cost_le({code[k], lo[k] + (hi[k] - lo[k]) / 2});
    const std::vector<double> global = allreduce_sum(comm, local_values);
    for (int k = 0; k < m; ++k) {
      const int64_t mid = lo[k] + (hi[k] - lo[k]) / 2;
      if (global[k] >= target[k]) hi[k] = mid; else lo[k] = std::min(mid + 1, hi[k]);
    }
  }
  // K* = (C, G) is the row whose cost takes the prefix to the target; the boundary goes before
  // it when that is at least as near the target (the rule of balanced_boundaries).
  std::vector<double> le_lt(2 * m);
  for (int k = 0; k < m; ++k) {
    le_lt[2 * k] = local.cost_le({code[k], lo[k]});
    le_lt[2 * k + 1] = local.cost_lt({code[k], lo[k]});
  }
  const std::vector<double> sums = allreduce_sum(comm, le_lt);
  torch::Tensor starts = torch::empty({m, 2}, torch::kInt64);
  for (int k = 0; k < m; ++k) {
    const bool before = target[k] - sums[2 * k + 1] <= sums[2 * k] - target[k];
    starts[k][0] = code[k];
    starts[k][1] = before ? lo[k] : lo[k] + 1;
  }
  starts = starts.to(comm.device());
  comm.broadcast(starts, 0);
  const std::vector<int64_t> flat = to_int64s(starts);
  std::vector<Key> result(m);
  for (int k = 0; k < m; ++k) result[k] = {flat[2 * k], flat[2 * k + 1]};
  return result;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError(message);
}

}  // namespace

SceneBounds global_bounds(distributed::Communicator& comm, const torch::Tensor& means) {
  require(means.dim() == 2 && means.size(1) == 3, "global_bounds: means must be [n, 3]");
  const double inf = std::numeric_limits<double>::infinity();
  torch::Tensor lo = torch::full({3}, inf, torch::kFloat64);
  torch::Tensor hi = torch::full({3}, -inf, torch::kFloat64);
  if (means.size(0) > 0) {
    const torch::Tensor m = means.detach().to(torch::kCPU, torch::kFloat64);
    lo = std::get<0>(m.min(0));
    hi = std::get<0>(m.max(0));
  }
  lo = lo.to(comm.device());
  hi = hi.to(comm.device());
  comm.allreduce(lo, distributed::ReduceOp::Min);
  comm.allreduce(hi, distributed::ReduceOp::Max);
  const std::vector<double> l = to_doubles(lo), h = to_doubles(hi);
  SceneBounds b;
  if (!(l[0] <= h[0])) return b;  // no rows anywhere
  for (int a = 0; a < 3; ++a) b.lo[a] = l[a], b.hi[a] = h[a];
  return b;
}

torch::Tensor morton_codes(const torch::Tensor& means, const SceneBounds& bounds,
                           int bits_per_axis) {
  require(means.dim() == 2 && means.size(1) == 3, "morton_codes: means must be [N, 3]");
  require(means.is_floating_point(), "morton_codes: means must be float32 or float64");
  require(bits_per_axis >= 1 && bits_per_axis <= kMortonBits63,
          "morton_codes: bits_per_axis must be in 1..21, got " + std::to_string(bits_per_axis));
  const torch::Tensor m = means.detach().to(torch::kFloat64);
  const double top = static_cast<double>((int64_t{1} << bits_per_axis) - 1);
  torch::Tensor code = torch::zeros({means.size(0)}, m.options().dtype(torch::kInt64));
  for (int a = 0; a < 3; ++a) {
    const double extent = bounds.hi[a] - bounds.lo[a];
    if (!(extent > 0.0) || !std::isfinite(extent)) continue;  // a flat axis quantizes to 0
    const double scale = std::ldexp(1.0, bits_per_axis) / extent;
    torch::Tensor q = ((m.select(1, a) - bounds.lo[a]) * scale).floor();
    q = torch::nan_to_num(q, 0.0, top, 0.0).clamp(0.0, top).to(torch::kInt64);
    code = code.bitwise_or(torch::bitwise_left_shift(spread_bits(q), a));
  }
  return code;
}

std::vector<int64_t> balanced_boundaries(const torch::Tensor& costs, int parts) {
  require(parts >= 1, "balanced_boundaries: parts must be >= 1");
  require(costs.dim() == 1, "balanced_boundaries: costs must be [T]");
  const std::vector<double> c = to_doubles(costs);
  const int64_t n = static_cast<int64_t>(c.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    require(std::isfinite(c[i]) && c[i] >= 0.0,
            "balanced_boundaries: costs must be finite and >= 0; entry " + std::to_string(i) +
                " is " + std::to_string(c[i]));
    prefix[i + 1] = prefix[i] + c[i];
  }
  if (!(prefix[n] > 0.0))  // nothing measured: split by count
    for (int64_t i = 0; i <= n; ++i) prefix[i] = static_cast<double>(i);
  const double total = prefix[n];
  std::vector<int64_t> b(parts + 1, 0);
  b[parts] = n;
  for (int k = 1; k < parts; ++k) {
    const double target = total * k / parts;
    int64_t i = std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin();
    if (i > 0 && target - prefix[i - 1] <= prefix[i] - target) --i;
    b[k] = std::max(b[k - 1], std::min(i, n));
  }
  return b;
}

RowMigration::RowMigration(distributed::Communicator& comm, const torch::Tensor& destination)
    : comm_(comm) {
  require(destination.dim() == 1 && destination.scalar_type() == torch::kInt64,
          "migrate_rows: destination must be [n] int64");
  n_ = destination.size(0);
  const torch::Device device = comm.device();
  if (n_ > 0) {
    const int64_t lo = destination.min().item<int64_t>(), hi = destination.max().item<int64_t>();
    require(lo >= 0 && hi < comm.size(), "migrate_rows: destination ranks must be in [0, " +
                                             std::to_string(comm.size()) + ")");
  }
  const torch::Tensor dest = destination.to(device);
  order_ = std::get<1>(dest.sort(/*stable=*/true, 0, false));
  send_counts_ = to_int64s(torch::bincount(dest, /*weights=*/{}, comm.size()));
  // Every rank learns how many rows it receives: the row counts travel as one empty column.
  std::vector<int64_t> recv_counts;
  comm.all_to_all_v(torch::zeros({n_, 1}, torch::TensorOptions(device).dtype(torch::kUInt8)),
                    send_counts_, &recv_counts);
  for (int64_t c : recv_counts) received_rows_ += c;
}

torch::Tensor RowMigration::move(const torch::Tensor& tensor, const torch::Tensor& then_order) {
  require(tensor.dim() >= 1 && tensor.size(0) == n_,
          "migrate_rows: a tensor must have " + std::to_string(n_) +
              " rows (the length of destination)");
  require(tensor.device() == comm_.device(),
          "migrate_rows: a tensor is not on the communicator's device");
  require(!then_order.defined() || (then_order.dim() == 1 && then_order.size(0) == received_rows_),
          "migrate_rows: then_order must hold one index per received row");
  // Every rank must move the same kind of rows, or the byte rows would be misread.
  std::string layout = c10::toString(tensor.scalar_type());
  for (int64_t d = 1; d < tensor.dim(); ++d) layout += "," + std::to_string(tensor.size(d));
  const int64_t fp = static_cast<int64_t>(distributed::fingerprint(layout) >> 2);
  torch::Tensor check = torch::tensor({fp, -fp}, torch::kInt64).to(comm_.device());
  comm_.allreduce(check, distributed::ReduceOp::Max);
  const std::vector<int64_t> got = to_int64s(check);
  require(got[0] == fp && got[1] == -fp,
          "migrate_rows: ranks passed tensors of different count, dtype or trailing shape");

  constexpr int64_t kSliceBytes = 32;
  const torch::Tensor bytes = detail::rows_as_bytes(tensor);
  const int64_t width = bytes.size(1);
  torch::Tensor out = torch::empty({received_rows_, width}, bytes.options());
  // out[j] = received[then_order[j]]: received row i goes to row inverse[i].
  torch::Tensor inverse;
  if (then_order.defined()) {
    const torch::Tensor order = then_order.to(comm_.device(), torch::kInt64);
    inverse = torch::full_like(order, -1);
    inverse.index_put_({order}, torch::arange(received_rows_, order.options()));
    if (received_rows_ > 0 && inverse.min().item<int64_t>() < 0)
      throw std::logic_error("migrate_rows: then_order is not a permutation of the received rows");
  }
  for (int64_t first = 0; first < width; first += kSliceBytes) {
    const int64_t w = std::min(kSliceBytes, width - first);
    const torch::Tensor slice =
        comm_.all_to_all_v(bytes.narrow(1, first, w).index_select(0, order_), send_counts_);
    if (inverse.defined())
      out.narrow(1, first, w).index_copy_(0, inverse, slice);
    else
      out.narrow(1, first, w).copy_(slice);
  }
  torch::Tensor rows = detail::bytes_as_rows(out, tensor);
  if (tensor.requires_grad()) rows.requires_grad_(true);
  return rows;
}

std::vector<torch::Tensor> migrate_rows(distributed::Communicator& comm, const torch::Tensor& destination,
                                        const std::vector<torch::Tensor>& tensors) {
  RowMigration migration(comm, destination);
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& t : tensors) out.push_back(migration.move(t));
  return out;
}

RebalanceReport rebalance(distributed::Communicator& comm, ShardRows& rows, const SceneBounds& bounds,
                          const RebalanceOptions& options) {
  require(rows.means.dim() == 2 && rows.means.size(1) == 3, "rebalance: means must be [n, 3]");
  const int64_t n = rows.means.size(0);
  const torch::Device device = comm.device();
  require(rows.global_ids.dim() == 1 && rows.global_ids.size(0) == n &&
              rows.global_ids.scalar_type() == torch::kInt64,
          "rebalance: global_ids must be [n] int64 with n the rows of means");
  require(!rows.costs.defined() || (rows.costs.dim() == 1 && rows.costs.size(0) == n),
          "rebalance: costs must be [n] or undefined");
  const torch::Tensor costs = rows.costs.defined()
                                  ? rows.costs.detach().to(device, torch::kFloat64)
                                  : torch::ones({n}, torch::TensorOptions(device).dtype(torch::kFloat64));

  // Imbalance of counts and costs; rank 0 decides, everyone follows.
  torch::Tensor sums = torch::stack({torch::tensor(static_cast<double>(n), torch::kFloat64),
                                     costs.sum().cpu()}).to(device);
  torch::Tensor maxs = sums.clone();
  comm.allreduce(sums, distributed::ReduceOp::Sum);
  comm.allreduce(maxs, distributed::ReduceOp::Max);
  const std::vector<double> s = to_doubles(sums), mx = to_doubles(maxs);
  RebalanceReport report;
  const double w = comm.size();
  report.global_rows = static_cast<int64_t>(std::llround(s[0]));
  if (s[0] > 0) report.count_imbalance = mx[0] / (s[0] / w);
  if (s[1] > 0) report.cost_imbalance = mx[1] / (s[1] / w);
  torch::Tensor decide = torch::tensor(
      {static_cast<int64_t>(options.force ||
                            report.count_imbalance > options.imbalance_threshold ||
                            report.cost_imbalance > options.imbalance_threshold)},
      torch::kInt64).to(device);
  comm.broadcast(decide, 0);
  if (decide.item<int64_t>() == 0 || report.global_rows == 0) return report;
  report.migrated = true;

  // Local rows in key order; the global split points by distributed bisection.
  const torch::Tensor codes = morton_codes(rows.means, bounds, options.bits_per_axis);
  const torch::Tensor ids = rows.global_ids.to(device);
  const torch::Tensor order = key_order(codes, ids);
  LocalKeys local;
  {
    const std::vector<int64_t> c = to_int64s(codes.index_select(0, order));
    const std::vector<int64_t> g = to_int64s(ids.index_select(0, order));
    const bool unit = !(s[1] > 0);  // nothing measured: balance counts
    const std::vector<double> k = unit ? std::vector<double>(n, 1.0)
                                       : to_doubles(costs.index_select(0, order));
    local.keys.resize(n);
    local.prefix.assign(n + 1, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      local.keys[i] = {c[i], g[i]};
      local.prefix[i + 1] = local.prefix[i] + k[i];
    }
  }
  const std::vector<Key> starts = start_keys(comm, local, s[1] > 0 ? s[1] : s[0]);
  // Rows in key order: the destination steps up by one at each start key.
  std::vector<int64_t> dest_sorted(n + 1, 0);
  for (const Key& start : starts)
    ++dest_sorted[std::lower_bound(local.keys.begin(), local.keys.end(), start) -
                  local.keys.begin()];
  for (int64_t i = 1; i < n; ++i) dest_sorted[i] += dest_sorted[i - 1];
  dest_sorted.resize(n);
  torch::Tensor destination = torch::empty({n}, torch::TensorOptions(device).dtype(torch::kInt64));
  destination.index_put_({order}, torch::tensor(dest_sorted, torch::kInt64).to(device));
  const int64_t kept = (destination == comm.rank()).sum().item<int64_t>();
  report.rows_sent = n - kept;

  // Ids and codes first: they give the received rows' key order, and every other tensor is
  // replaced in `rows` as soon as it arrives in that order, so that its old rows can go.
  RowMigration migration(comm, destination);
  const torch::Tensor got_ids = migration.move(rows.global_ids.to(device));
  const torch::Tensor new_order = key_order(migration.move(codes), got_ids);
  const auto arrive = [&](torch::Tensor& t) { t = migration.move(t, new_order); };
  if (options.before_moving) options.before_moving();
  rows.global_ids = got_ids.index_select(0, new_order);
  arrive(rows.means);
  if (rows.costs.defined()) arrive(rows.costs);
  for (torch::Tensor& t : rows.tensors) arrive(t);
  report.rows_received = migration.received_rows() - kept;
  return report;
}

std::string agreed_error(distributed::Communicator& comm, const std::string& local) {
  const torch::Device device = comm.device();
  const torch::Tensor lengths =
      comm.allgather(torch::tensor({static_cast<int64_t>(local.size())}, torch::kInt64).to(device))
          .cpu()
          .reshape({-1});
  if (lengths.sum().item<int64_t>() == 0) return "";
  torch::Tensor bytes = torch::empty({static_cast<int64_t>(local.size())}, torch::kUInt8);
  if (!local.empty()) std::memcpy(bytes.data_ptr<uint8_t>(), local.data(), local.size());
  const torch::Tensor all = comm.allgatherv(bytes.to(device)).cpu();
  int64_t offset = 0;
  for (int64_t r = 0; r < lengths.size(0); ++r) {
    const int64_t n = lengths[r].item<int64_t>();
    if (n > 0)
      return std::string(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + offset, n);
    offset += n;
  }
  return "";
}

}  // namespace tessera::models::gaussians
