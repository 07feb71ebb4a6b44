// Bitwise comparison of training runs (docs/training_loop.md, "Bitwise at any world size"): a
// run's final parameters and Adam moments and every number it reported, compared with
// torch::equal and ==, never a tolerance. Used by the families' tests of run.deterministic.
#pragma once

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "framework/family.h"

namespace tessera::test {

// Sets the intra-op threads for its lifetime.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : previous_(at::get_num_threads()) { at::set_num_threads(n); }
  ~IntraOpThreads() { at::set_num_threads(previous_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int previous_;
};

// Parameters then Adam's first and second moments, flattened, in parameter order.
inline torch::Tensor adam_state_of(torch::optim::Adam& adam) {
  std::vector<torch::Tensor> params, moments;
  for (auto& group : adam.param_groups())
    for (const torch::Tensor& p : group.params()) {
      params.push_back(p.detach().reshape({-1}).clone());
      const auto it = adam.state().find(p.unsafeGetTensorImpl());
      if (it == adam.state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
      moments.push_back(s.exp_avg().reshape({-1}));
      moments.push_back(s.exp_avg_sq().reshape({-1}));
    }
  params.insert(params.end(), moments.begin(), moments.end());
  return torch::cat(params);
}

// What a run gives: its final state and every number it reported, in order.
struct Trace {
  torch::Tensor state;          // adam_state_of
  std::vector<double> numbers;  // each step's loss and numeric fields, then eval scores

  void add(const StepRecord& r) {
    numbers.push_back(r.loss);
    for (const auto& field : r.fields.items())
      if (field.value().is_number()) numbers.push_back(field.value().get<double>());
  }
  void add(const EvalScores& scores) {
    for (const auto& [name, value] : scores.metrics) numbers.push_back(value);
  }
};

// got == want bit for bit, and every rank of `world` holds got's state.
inline void expect_bitwise(const Trace& got, const Trace& want, const std::string& what,
                           distributed::Communicator& world) {
  ASSERT_EQ(got.state.sizes(), want.state.sizes()) << what;
  const int64_t differ = got.state.ne(want.state).sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << want.state.numel()
                       << " parameter and moment values differ";
  ASSERT_EQ(got.numbers.size(), want.numbers.size()) << what;
  for (size_t i = 0; i < want.numbers.size(); ++i)
    EXPECT_EQ(got.numbers[i], want.numbers[i]) << what << ": number " << i;
  const torch::Tensor all = world.allgather(got.state);
  for (int r = 0; r < world.size(); ++r)
    EXPECT_TRUE(torch::equal(all[r], got.state)) << what << ": rank " << r;
}

}  // namespace tessera::test
