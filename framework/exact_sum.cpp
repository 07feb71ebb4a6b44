#include "framework/exact_sum.h"

#include "kernels/fixed_point.h"

namespace tessera {

namespace {
// The limbs' headroom (kernels/fixed_point.h) less a margin for the carries of a normalization.
constexpr int64_t kMaxAdditions = int64_t{1} << 22;
}  // namespace

ExactSum::ExactSum(const std::vector<std::vector<int64_t>>& shapes, torch::Device device)
    : shapes_(shapes) {
  for (const std::vector<int64_t>& shape : shapes_) {
    offsets_.push_back(rows_);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    rows_ += n;
  }
  limbs_ = torch::zeros({rows_ + static_cast<int64_t>(shapes_.size()), kernels::kFixedPointLimbs},
                        torch::TensorOptions().dtype(torch::kInt64).device(device));
}

void ExactSum::clear() {
  limbs_.zero_();
  additions_ = 0;
}

void ExactSum::count_addition() {
  if (++additions_ < kMaxAdditions) return;
  kernels::fixed_point_normalize(limbs_);
  additions_ = 1;
}

int64_t ExactSum::elements(size_t index) const {
  return index + 1 < offsets_.size() ? offsets_[index + 1] - offsets_[index]
                                     : rows_ - offsets_[index];
}

torch::Tensor ExactSum::bad_count(size_t index) {
  return limbs_[rows_ + static_cast<int64_t>(index)].narrow(0, 0, 1);
}

void ExactSum::add(size_t index, const torch::Tensor& value) {
  if (!value.defined()) return;
  const int64_t n = elements(index);
  TORCH_CHECK(value.numel() == n, "ExactSum::add: sum ", index, " holds ", n, " elements, got ",
              value.numel());
  count_addition();
  torch::Tensor rows = limbs_.narrow(0, offsets_[index], n);
  torch::Tensor bad = bad_count(index);
  kernels::fixed_point_add(rows, value.to(limbs_.device(), torch::kFloat32), bad);
}

void ExactSum::allreduce(distributed::Communicator& comm) {
  kernels::fixed_point_normalize(limbs_);  // digits < 2^40: N ranks' sum cannot overflow
  if (comm.size() > 1) {
    torch::Tensor flat = limbs_.view({-1});
    comm.allreduce(flat, distributed::ReduceOp::Sum);
  }
  kernels::fixed_point_normalize(limbs_);
  additions_ = 0;
}

torch::Tensor ExactSum::value(size_t index, torch::ScalarType dtype) {
  // NaN when a value could not be held; no host sync, so a CUDA step reads every parameter's
  // sum without waiting. detach(): a grad may not be a view in autograd's sense (its storage is
  // the fresh read-back buffer's, private).
  return kernels::fixed_point_to_float(limbs_.narrow(0, offsets_[index], elements(index)), dtype,
                                       bad_count(index))
      .view(shapes_[index])
      .detach();
}

}  // namespace tessera
