// Tests of the training utilities: LR and sampling-rate schedules against hand-computed values,
// the dynamic loss scaler's rules and state, PSNR/SSIM against a naive reference, the fused Adam
// step against torch's, and the phase timer.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "distributed/errors.h"
#include "framework/budget.h"
#include "framework/even_slice.h"
#include "framework/fused_adam.h"
#include "framework/learning_check.h"
#include "framework/loss_scaler.h"
#include "framework/metrics.h"
#include "framework/phase_timer.h"
#include "framework/schedule.h"
#include "framework/tensorboard/event_file.h"
#include "tests/cuda_skip.h"

namespace {

using tessera::LossScaler;
using tessera::LossScalerOptions;
using tessera::LrSchedule;
using tessera::LrScheduleOptions;
using tessera::SamplingSchedule;
using tessera::SamplingScheduleOptions;
using tessera::UserError;

constexpr double kPi = 3.14159265358979323846;
constexpr double kTol = 1e-12;

// Runs fn, expects a UserError whose message contains every one of `parts`.
template <typename Fn>
void expect_user_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected tessera::UserError";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
  }
}

LrScheduleOptions lr_opts(const std::string& name, int64_t warmup = 0) {
  LrScheduleOptions o;
  o.name = name;
  o.lr = 1e-2;
  o.final_lr = 1e-4;
  o.total_steps = 1000;
  o.warmup_steps = warmup;
  return o;
}

SamplingScheduleOptions rate_opts(const std::string& name) {
  SamplingScheduleOptions o;
  o.name = name;
  o.rate_max = 1.0;
  o.rate_min = 0.25;
  o.total_steps = 1000;
  o.step_every = 100;
  o.step_factor = 0.5;
  return o;
}

// ---------------------------------------------------------------------------------------------
// LR schedules

TEST(LrSchedule, ConstantIsLrEverywhere) {
  const LrSchedule s(lr_opts("constant"));
  for (int64_t t : {0, 500, 1000, 5000}) EXPECT_EQ(s.at(t), 1e-2) << t;
  EXPECT_EQ(s.options().name, "constant");
}

TEST(LrSchedule, ExponentialHandValues) {
  const LrSchedule s(lr_opts("exponential"));
  EXPECT_NEAR(s.at(0), 1e-2, kTol);
  EXPECT_NEAR(s.at(500), 1e-3, kTol);  // geometric mean of 1e-2 and 1e-4
  EXPECT_NEAR(s.at(1000), 1e-4, kTol);
  EXPECT_NEAR(s.at(250), 1e-2 * std::pow(1e-2, 0.25), kTol);
  EXPECT_NEAR(s.at(2000), 1e-4, kTol);  // held past T
}

TEST(LrSchedule, CosineHandValues) {
  const LrSchedule s(lr_opts("cosine"));
  EXPECT_NEAR(s.at(0), 1e-2, kTol);
  EXPECT_NEAR(s.at(500), (1e-2 + 1e-4) / 2, kTol);
  EXPECT_NEAR(s.at(1000), 1e-4, kTol);
  EXPECT_NEAR(s.at(250), 1e-4 + (1e-2 - 1e-4) * (1 + std::sqrt(0.5)) / 2, kTol);
  EXPECT_NEAR(s.at(1500), 1e-4, kTol);
}

TEST(LrSchedule, DecayingSchedulesAreMonotone) {
  for (const char* name : {"exponential", "cosine"}) {
    const LrSchedule s(lr_opts(name));
    for (int64_t t = 1; t <= 1000; ++t) ASSERT_LE(s.at(t), s.at(t - 1)) << name << " t=" << t;
    EXPECT_LT(s.at(1000), s.at(0)) << name;
  }
}

TEST(LrSchedule, WarmupRampsLinearlyFromLrOverWarmup) {
  const LrSchedule c(lr_opts("constant", 10));
  EXPECT_NEAR(c.at(0), 1e-3, kTol);  // lr / warmup
  EXPECT_NEAR(c.at(4), 5e-3, kTol);
  EXPECT_NEAR(c.at(9), 1e-2, kTol);
  EXPECT_NEAR(c.at(10), 1e-2, kTol);
  for (int64_t t = 1; t < 10; ++t) EXPECT_GT(c.at(t), c.at(t - 1));

  // With cosine: the ramp multiplies the decayed value.
  const LrSchedule s(lr_opts("cosine", 100));
  auto cosine = [](double p) { return 1e-4 + (1e-2 - 1e-4) * (1 + std::cos(kPi * p)) / 2; };
  EXPECT_NEAR(s.at(0), cosine(0.0) / 100, kTol);
  EXPECT_NEAR(s.at(49), cosine(0.049) * 0.5, kTol);
  EXPECT_NEAR(s.at(100), cosine(0.1), kTol);
  EXPECT_NEAR(s.at(500), (1e-2 + 1e-4) / 2, kTol);
  EXPECT_NEAR(s.at(1000), 1e-4, kTol);
}

TEST(LrSchedule, IsAPureFunctionOfTheStep) {
  const LrSchedule a(lr_opts("cosine", 20)), b(lr_opts("cosine", 20));
  const double late = a.at(777);
  for (int64_t t = 0; t < 800; ++t) (void)a.at(t);
  EXPECT_EQ(a.at(777), late);
  EXPECT_EQ(a.at(777), b.at(777));
}

TEST(LrSchedule, BadOptionsThrowUserError) {
  auto make = [](LrScheduleOptions o) { return [o] { LrSchedule s(o); }; };
  LrScheduleOptions o = lr_opts("cosine");
  o.lr = -1e-3;
  expect_user_error(make(o), {"lr", "> 0"});
  o = lr_opts("constant");
  o.lr = 0.0;
  expect_user_error(make(o), {"lr"});
  o = lr_opts("exponential");
  o.final_lr = 0.0;
  expect_user_error(make(o), {"final_lr"});
  o = lr_opts("cosine");
  o.final_lr = 1.0;  // above lr
  expect_user_error(make(o), {"final_lr"});
  o = lr_opts("cosine");
  o.total_steps = 0;
  expect_user_error(make(o), {"total_steps"});
  o = lr_opts("cosine");
  o.warmup_steps = -1;
  expect_user_error(make(o), {"warmup_steps"});
  o = lr_opts("cosine");
  o.name = "linear_warmup";
  expect_user_error(make(o), {"linear_warmup", "constant", "exponential", "cosine"});
  // final_lr is not used by constant, so it is not checked there.
  o = lr_opts("constant");
  o.lr = 1e-5;
  EXPECT_NO_THROW(make(o)());
}

TEST(LrSchedule, NamesForTheConfigSchema) {
  EXPECT_EQ(tessera::lr_schedule_names(),
            (std::vector<std::string>{"constant", "exponential", "cosine"}));
  EXPECT_EQ(tessera::sampling_schedule_names(),
            (std::vector<std::string>{"constant", "linear", "cosine", "step"}));
}

// ---------------------------------------------------------------------------------------------
// Sampling-rate schedules

TEST(SamplingSchedule, ConstantIsRateMax) {
  SamplingScheduleOptions o = rate_opts("constant");
  o.rate_max = 0.5;
  o.rate_min = 0.9;  // unused by constant
  const SamplingSchedule s(o);
  for (int64_t t : {0, 500, 1000, 4000}) EXPECT_EQ(s.at(t), 0.5);
}

TEST(SamplingSchedule, LinearHandValues) {
  const SamplingSchedule s(rate_opts("linear"));
  EXPECT_NEAR(s.at(0), 1.0, kTol);
  EXPECT_NEAR(s.at(500), 0.625, kTol);
  EXPECT_NEAR(s.at(1000), 0.25, kTol);
  EXPECT_NEAR(s.at(250), 0.8125, kTol);
  EXPECT_NEAR(s.at(3000), 0.25, kTol);
}

TEST(SamplingSchedule, CosineHandValues) {
  const SamplingSchedule s(rate_opts("cosine"));
  EXPECT_NEAR(s.at(0), 1.0, kTol);
  EXPECT_NEAR(s.at(500), 0.625, kTol);
  EXPECT_NEAR(s.at(1000), 0.25, kTol);
  EXPECT_NEAR(s.at(250), 0.25 + 0.75 * (1 + std::sqrt(0.5)) / 2, kTol);
}

TEST(SamplingSchedule, StepHandValues) {
  const SamplingSchedule s(rate_opts("step"));
  EXPECT_EQ(s.at(0), 1.0);
  EXPECT_EQ(s.at(99), 1.0);
  EXPECT_EQ(s.at(100), 0.5);
  EXPECT_EQ(s.at(199), 0.5);
  EXPECT_EQ(s.at(200), 0.25);
  EXPECT_EQ(s.at(500), 0.25);   // T/2: 1/32 clamped to rate_min
  EXPECT_EQ(s.at(1000), 0.25);  // T
}

TEST(SamplingSchedule, DecreasingSchedulesAreMonotoneAndInRange) {
  for (const char* name : {"linear", "cosine", "step"}) {
    const SamplingSchedule s(rate_opts(name));
    for (int64_t t = 0; t <= 1200; ++t) {
      const double r = s.at(t);
      ASSERT_GE(r, 0.25) << name << " t=" << t;
      ASSERT_LE(r, 1.0) << name << " t=" << t;
      if (t > 0) {
        ASSERT_LE(r, s.at(t - 1)) << name << " t=" << t;
      }
    }
  }
}

TEST(SamplingSchedule, BadOptionsThrowUserError) {
  auto make = [](SamplingScheduleOptions o) { return [o] { SamplingSchedule s(o); }; };
  SamplingScheduleOptions o = rate_opts("linear");
  o.rate_max = 1.5;
  expect_user_error(make(o), {"rate_max", "(0, 1]"});
  o = rate_opts("constant");
  o.rate_max = 0.0;
  expect_user_error(make(o), {"rate_max"});
  o = rate_opts("cosine");
  o.rate_min = -0.1;
  expect_user_error(make(o), {"rate_min", "(0, 1]"});
  o = rate_opts("linear");
  o.rate_min = 0.8;
  o.rate_max = 0.5;
  expect_user_error(make(o), {"rate_min", "greater than rate_max"});
  o = rate_opts("step");
  o.step_every = 0;
  expect_user_error(make(o), {"step_every"});
  o = rate_opts("step");
  o.step_factor = 1.5;
  expect_user_error(make(o), {"step_factor"});
  o = rate_opts("linear");
  o.total_steps = 0;
  expect_user_error(make(o), {"total_steps"});
  o = rate_opts("linear");
  o.name = "exponential";
  expect_user_error(make(o), {"'exponential'", "constant", "linear", "cosine", "step"});
}

TEST(SamplingSchedule, LrRescaleIsSquareRootOfTheRateRatio) {
  EXPECT_EQ(tessera::lr_rescale(1.0, 1.0), 1.0);
  EXPECT_EQ(tessera::lr_rescale(0.25, 1.0), 0.5);
  EXPECT_EQ(tessera::lr_rescale(0.125, 0.5), 0.5);
  EXPECT_NEAR(tessera::lr_rescale(0.5, 1.0), std::sqrt(0.5), kTol);
  EXPECT_THROW(tessera::lr_rescale(0.0, 1.0), std::invalid_argument);
  // Combined with cosine annealing as the trainer does.
  const LrSchedule lr(lr_opts("cosine"));
  const SamplingSchedule rate(rate_opts("linear"));
  EXPECT_NEAR(lr.at(1000) * tessera::lr_rescale(rate.at(1000), 1.0), 1e-4 * 0.5, kTol);
}

// ---------------------------------------------------------------------------------------------
// Loss scaler

LossScalerOptions scaler_opts(int64_t growth_interval = 3) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1024.0;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.5;
  o.growth_interval = growth_interval;
  return o;
}

TEST(LossScaler, BacksOffAndSkipsOnInf) {
  LossScaler s(scaler_opts());
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(LossScaler, GrowsAfterExactlyGrowthIntervalGoodSteps) {
  LossScaler s(scaler_opts(3));
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024.0);  // 2 good steps: not yet
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 2048.0);  // the 3rd: grows
  // An inf resets the counter: 2 good, inf, 2 good -> no growth; the 3rd after the inf grows.
  s.update(false);
  s.update(false);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScaler, ScaleLossAndUnscaleAreExact) {
  LossScaler s(scaler_opts());
  const torch::Tensor loss = torch::tensor(0.3f);
  EXPECT_EQ(s.scale_loss(loss).item<float>(), 0.3f * 1024.0f);
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kFloat16}) {
    const torch::Tensor g0 = torch::randn({257}, torch::dtype(dtype));
    const torch::Tensor g1 = torch::randn({3, 5}, torch::dtype(dtype));
    std::vector<torch::Tensor> grads = {g0 * 1024, g1 * 1024, torch::Tensor()};
    EXPECT_EQ(s.unscale_and_count_nonfinite(grads), 0);
    EXPECT_TRUE(torch::equal(grads[0], g0)) << dtype;  // powers of two divide exactly
    EXPECT_TRUE(torch::equal(grads[1], g1)) << dtype;
  }
}

TEST(LossScaler, NonFiniteGradsAreCountedAndLeftScaled) {
  LossScaler s(scaler_opts());
  torch::Tensor a = torch::full({4}, 2048.0f);
  torch::Tensor b = torch::tensor({1.0f, std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN()});
  std::vector<torch::Tensor> grads = {a, b};
  EXPECT_EQ(s.unscale_and_count_nonfinite(grads), 2);
  EXPECT_EQ(a[0].item<float>(), 2048.0f);  // not unscaled: the step will be skipped
  EXPECT_EQ(s.unscale_and_count_nonfinite({}), 0);
}

TEST(LossScaler, DisabledIsANoOpWithScaleOne) {
  LossScaler s(LossScalerOptions{});  // enabled = false
  EXPECT_EQ(s.scale(), 1.0);
  const torch::Tensor loss = torch::tensor(0.7f);
  EXPECT_TRUE(torch::equal(s.scale_loss(loss), loss));
  const torch::Tensor g0 = torch::randn({16});
  std::vector<torch::Tensor> grads = {g0.clone()};
  EXPECT_EQ(s.unscale_and_count_nonfinite(grads), 0);
  EXPECT_TRUE(torch::equal(grads[0], g0));
  for (int i = 0; i < 5000; ++i) ASSERT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(true));  // a non-finite step is still skipped
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a(scaler_opts(4));
  a.update(true);
  a.update(false);
  a.update(false);
  const std::vector<double> st = a.state();
  ASSERT_EQ(st.size(), 3u);
  LossScaler b(scaler_opts(4));
  b.load_state(st);
  EXPECT_EQ(b.state(), st);
  EXPECT_EQ(b.scale(), 512.0);
  EXPECT_EQ(b.skipped_steps(), 1);
  // Both continue identically: 2 more good steps grow both.
  for (LossScaler* s : {&a, &b}) {
    s->update(false);
    s->update(false);
  }
  EXPECT_EQ(a.scale(), 1024.0);
  EXPECT_EQ(a.state(), b.state());
  EXPECT_THROW(b.load_state({1.0, 2.0}), UserError);
  EXPECT_THROW(b.load_state({-1.0, 0.0, 0.0}), UserError);
}

TEST(LossScaler, BadOptionsThrowUserError) {
  LossScalerOptions o = scaler_opts();
  o.init_scale = 0.0;
  expect_user_error([o] { LossScaler s(o); }, {"init_scale"});
  o = scaler_opts();
  o.growth_factor = 1.0;
  expect_user_error([o] { LossScaler s(o); }, {"growth_factor"});
  o = scaler_opts();
  o.backoff_factor = 1.0;
  expect_user_error([o] { LossScaler s(o); }, {"backoff_factor"});
  o = scaler_opts();
  o.growth_interval = 0;
  expect_user_error([o] { LossScaler s(o); }, {"growth_interval"});
}

// ---------------------------------------------------------------------------------------------
// Metrics

// Independent SSIM: explicit loops over every valid 11x11 window, in double.
double naive_ssim(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kFloat64).contiguous();
  const torch::Tensor y = b.to(torch::kFloat64).contiguous();
  const int64_t H = x.size(0), W = x.size(1), C = x.size(2), K = 11;
  const auto xa = x.accessor<double, 3>();
  const auto ya = y.accessor<double, 3>();
  double w[11][11], wsum = 0;
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) {
      const double di = i - 5.0, dj = j - 5.0;
      w[i][j] = std::exp(-(di * di + dj * dj) / (2 * 1.5 * 1.5));
      wsum += w[i][j];
    }
  const double c1 = 0.01 * 0.01, c2 = 0.03 * 0.03;
  double total = 0;
  for (int64_t c = 0; c < C; ++c) {
    double chan = 0;
    for (int64_t r = 0; r + K <= H; ++r)
      for (int64_t q = 0; q + K <= W; ++q) {
        double mx = 0, my = 0, sxx = 0, syy = 0, sxy = 0;
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < K; ++j) {
            const double wt = w[i][j] / wsum;
            const double u = xa[r + i][q + j][c], v = ya[r + i][q + j][c];
            mx += wt * u;
            my += wt * v;
            sxx += wt * u * u;
            syy += wt * v * v;
            sxy += wt * u * v;
          }
        const double vx = sxx - mx * mx, vy = syy - my * my, cxy = sxy - mx * my;
        chan += ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2));
      }
    total += chan / static_cast<double>((H - K + 1) * (W - K + 1));
  }
  return total / static_cast<double>(C);
}

TEST(Metrics, PsnrOfIdenticalImagesIsInfinite) {
  const torch::Tensor img = torch::rand({8, 9, 3});
  EXPECT_EQ(tessera::mse(img, img), 0.0);
  const double p = tessera::psnr(img, img.clone());
  EXPECT_TRUE(std::isinf(p) && p > 0);
}

TEST(Metrics, PsnrOfConstantOffset) {
  for (double d : {0.5, 0.25, 0.0625, 0.1, 0.03}) {
    const torch::Tensor a = torch::full({16, 12, 3}, 0.2, torch::kFloat64);
    const torch::Tensor b = a + d;
    const double dd = (b - a).abs().max().item<double>();  // d after rounding of the sum
    EXPECT_NEAR(tessera::mse(a, b), dd * dd, 1e-15) << d;
    EXPECT_NEAR(tessera::psnr(a, b), -20.0 * std::log10(dd), 1e-10) << d;
  }
  // Powers of two: exact in float32 as well.
  const torch::Tensor z = torch::zeros({4, 4, 3});
  EXPECT_DOUBLE_EQ(tessera::psnr(z, z + 0.25f), -20.0 * std::log10(0.25));
}

TEST(Metrics, SsimOfIdenticalImagesIsOne) {
  torch::manual_seed(1);
  const torch::Tensor img = torch::rand({24, 20, 3});
  EXPECT_NEAR(tessera::ssim(img, img), 1.0, 1e-6);
  const torch::Tensor flat = torch::full({11, 11, 3}, 0.4f);  // exactly one window
  EXPECT_NEAR(tessera::ssim(flat, flat), 1.0, 1e-6);
}

TEST(Metrics, SsimMatchesNaiveReference) {
  torch::manual_seed(2);
  for (int trial = 0; trial < 3; ++trial) {
    const torch::Tensor a = torch::rand({32, 32, 3});
    const torch::Tensor b = (a + 0.2 * torch::randn({32, 32, 3})).clamp(0, 1);
    const torch::Tensor c = torch::rand({32, 32, 3});  // independent
    EXPECT_NEAR(tessera::ssim(a, b), naive_ssim(a, b), 1e-6);
    EXPECT_NEAR(tessera::ssim(a, c), naive_ssim(a, c), 1e-6);
  }
  // Non-square, one channel, minimum height.
  const torch::Tensor a = torch::rand({11, 29, 1}), b = torch::rand({11, 29, 1});
  EXPECT_NEAR(tessera::ssim(a, b), naive_ssim(a, b), 1e-6);
}

TEST(Metrics, SsimDecreasesWithNoise) {
  torch::manual_seed(3);
  const torch::Tensor img = torch::rand({48, 40, 3});
  const torch::Tensor noise = torch::randn({48, 40, 3});
  double prev = tessera::ssim(img, img);
  for (double sigma : {0.01, 0.05, 0.1, 0.3}) {
    const double s = tessera::ssim(img, img + sigma * noise);
    EXPECT_LT(s, prev) << sigma;
    prev = s;
  }
  EXPECT_LT(prev, 0.8);  // sigma 0.3 on a uniform-random image: about 0.64
}

TEST(Metrics, BadInputsAreClearErrors) {
  const torch::Tensor small = torch::rand({10, 32, 3});
  expect_user_error([&] { tessera::ssim(small, small); }, {"10x32", "11x11"});
  const torch::Tensor narrow = torch::rand({32, 8, 3});
  EXPECT_THROW(tessera::ssim(narrow, narrow), UserError);
  EXPECT_THROW(tessera::mse(torch::rand({4, 4, 3}), torch::rand({4, 5, 3})), std::invalid_argument);
  EXPECT_THROW(tessera::psnr(torch::rand({4, 4}), torch::rand({4, 4})), std::invalid_argument);
  EXPECT_THROW(tessera::mse(torch::zeros({0, 4, 3}), torch::zeros({0, 4, 3})),
               std::invalid_argument);
}

TEST(Metrics, CudaMatchesCpu) {
  TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available(), "no CUDA device");
  torch::manual_seed(4);
  const torch::Tensor a = torch::rand({32, 40, 3}), b = torch::rand({32, 40, 3});
  const torch::Device cuda(torch::kCUDA);
  EXPECT_NEAR(tessera::ssim(a.to(cuda), b.to(cuda)), tessera::ssim(a, b), 1e-9);
  EXPECT_NEAR(tessera::psnr(a.to(cuda), b), tessera::psnr(a, b), 1e-9);
  LossScaler s(scaler_opts());
  std::vector<torch::Tensor> grads = {torch::full({8}, 4096.0f, cuda)};
  EXPECT_EQ(s.unscale_and_count_nonfinite(grads), 0);
  EXPECT_EQ(grads[0][0].item<float>(), 4.0f);
}

}  // namespace

// ---- LearningCheck ----------------------------------------------------------------------------

TEST(LearningCheck, WarnsOnceWhenTheLossDoesNotFallAndNamesTheCauses) {
  tessera::LearningCheck check(
      300, tessera::capture_not_learning_causes("(4) learning rate: nerf.lr too high;"));
  std::optional<std::string> warning;
  int warnings = 0;
  for (int64_t step = 0; step < 600; ++step) {
    // A noisy plateau around 0.09 after a fast first fall to it: the loss a NeRF gives for a
    // wrong scene box (it fits the mean color in a few steps, then nothing more).
    const double loss = 0.09 + 0.005 * std::sin(0.7 * static_cast<double>(step)) +
                        0.3 * std::exp(-0.5 * static_cast<double>(step));
    if (auto w = check.observe(step, loss)) {
      warning = w;
      ++warnings;
      EXPECT_EQ(step, 299) << "the warning comes after `after` steps";
    }
  }
  ASSERT_EQ(warnings, 1);
  for (const char* needle : {"not improving", "poses", "bounds", "background", "nerf.lr"})
    EXPECT_NE(warning->find(needle), std::string::npos) << needle << " in: " << *warning;
}

TEST(LearningCheck, SilentWhenLearningDisabledOrAfterAResume) {
  tessera::LearningCheck learning(300, "");
  for (int64_t step = 1000; step < 1400; ++step)  // a resumed run counts from its first step
    EXPECT_FALSE(learning.observe(step, 0.1 * std::exp(-0.01 * static_cast<double>(step - 1000))))
        << step;
  tessera::LearningCheck off(0, "");
  for (int64_t step = 0; step < 400; ++step) EXPECT_FALSE(off.observe(step, 0.5));
  // A plateau names the family's causes, and only those: a family that trains on no captured
  // views (point-diffusion) is not told about poses.
  tessera::LearningCheck flat(100, "(1) learning rate: diffusion.lr;");
  std::optional<std::string> w;
  for (int64_t step = 0; step < 100 && !w; ++step) w = flat.observe(step, 0.2);
  ASSERT_TRUE(w.has_value());
  EXPECT_NE(w->find("diffusion.lr"), std::string::npos) << *w;
  EXPECT_EQ(w->find("poses"), std::string::npos) << *w;
}

// ---- Budgets (framework/budget.h) ------------------------------------------------------------

TEST(Budget, EpochsAreCeiledPassesOverTheTrainingData) {
  using tessera::EpochSize;
  using tessera::steps_for_epochs;
  EXPECT_EQ(steps_for_epochs(1.0, EpochSize{4096.0, 1024.0}, "m"), 4);
  EXPECT_EQ(steps_for_epochs(1.1, EpochSize{4096.0, 1024.0}, "m"), 5);
  EXPECT_EQ(steps_for_epochs(30.0, EpochSize{70.0, 1.0}, "m"), 2100);   // 3DGS: views
  EXPECT_EQ(steps_for_epochs(1e-6, EpochSize{70.0, 1.0}, "m"), 1);      // at least one step
  EXPECT_THROW(steps_for_epochs(2.0, EpochSize{}, "m"), tessera::UserError);  // no epochs
  EXPECT_THROW(steps_for_epochs(2.0, EpochSize{0.0, 16.0}, "m"), tessera::UserError);
}

TEST(Budget, PlansTheStepsThatEndWithinTheBudgetAndItsReserve) {
  tessera::BudgetState s;
  s.budget_s = 1000.0;
  s.elapsed_s = 100.0;
  s.done = 50;
  s.seconds_per_cost = 2.0;
  s.mean_cost = 0.5;  // 1 s a step
  s.reserve_s = 40.0;
  s.cap = 100000;
  const double left = (1.0 - tessera::kBudgetMargin) * 1000.0 - 100.0 - 40.0;
  EXPECT_EQ(tessera::steps_within_budget(s), 50 + static_cast<int64_t>(std::floor(left)));
  s.cap = 300;  // within the cap
  EXPECT_EQ(tessera::steps_within_budget(s), 300);
  s.cap = 100000;
  s.elapsed_s = 990.0;  // already out of time: the step it is at, no more
  EXPECT_EQ(tessera::steps_within_budget(s), 51);
  s.elapsed_s = 100.0;
  s.seconds_per_cost = 0.0;  // nothing measured yet: the cap
  EXPECT_EQ(tessera::steps_within_budget(s), 100000);
}

TEST(Budget, ExhaustedWhenTheNextStepAndTheReserveDoNotFit) {
  EXPECT_FALSE(tessera::budget_exhausted(100.0, 80.0, 5.0, 10.0));
  EXPECT_TRUE(tessera::budget_exhausted(100.0, 80.0, 5.0, 15.1));
  EXPECT_TRUE(tessera::budget_exhausted(100.0, 96.0, 5.0, 0.0));
}

// ---- Train-eval gap (TrainingRun::evaluate) ---------------------------------------------------

TEST(OverfittingWarning, OnlyAboveTheGapAndNamesEveryCause) {
  using tessera::overfitting_warning;
  // The capture that showed it: batch PSNR 30 on train views, 17.2 on val views.
  const auto w = overfitting_warning(17.18, 29.6, "(4) floaters: nerf.near_gradient_distance;");
  ASSERT_TRUE(w.has_value());
  for (const char* needle : {"17.18", "12.4", "29.60", "coverage", "poses", "split",
                             "nerf.near_gradient_distance", "docs/datasets.md"})
    EXPECT_NE(w->find(needle), std::string::npos) << needle << " in: " << *w;
  // A gap at or below kOverfitGapDb is what a model that learned the scene shows; NaN (no train
  // score) never warns.
  EXPECT_FALSE(overfitting_warning(24.0, 24.0 + tessera::kOverfitGapDb, ""));
  EXPECT_TRUE(overfitting_warning(24.0, 24.01 + tessera::kOverfitGapDb, ""));
  EXPECT_FALSE(overfitting_warning(30.0, 26.0, ""));  // eval above train
  EXPECT_FALSE(overfitting_warning(20.0, std::nan(""), ""));
}

TEST(OverfittingWarning, TrainViewsAreSpreadOverTheSplit) {
  using tessera::spread_views;
  const std::vector<size_t> train = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15};  // 14 views
  EXPECT_EQ(spread_views(train, 4), (std::vector<size_t>{1, 4, 9, 12}));  // i * 14 / 4
  EXPECT_EQ(spread_views(train, 1), (std::vector<size_t>{1}));
  EXPECT_EQ(spread_views(train, 100), train);
  EXPECT_TRUE(spread_views(train, 0).empty());
  EXPECT_TRUE(spread_views({}, 4).empty());
}

// ---- adam_step, PhaseTimer --------------------------------------------------------------------

namespace tessera {
namespace {

// Two parameter groups (different learning rates, eps and betas), one parameter without a
// gradient at the first step, random gradients each step.
struct AdamSetup {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Adam> adam;
};

AdamSetup make_adam(uint64_t seed) {
  torch::manual_seed(seed);
  AdamSetup s;
  s.params = {torch::randn({1000, 3}).requires_grad_(true), torch::randn({77}).requires_grad_(true),
              torch::randn({5, 5}).requires_grad_(true)};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{s.params[0], s.params[1]},
                      std::make_unique<torch::optim::AdamOptions>(
                          torch::optim::AdamOptions(1e-2).eps(1e-15)));
  groups.emplace_back(std::vector<torch::Tensor>{s.params[2]},
                      std::make_unique<torch::optim::AdamOptions>(
                          torch::optim::AdamOptions(3e-3).eps(1e-8).betas({0.8, 0.95})));
  s.adam = std::make_unique<torch::optim::Adam>(std::move(groups),
                                                torch::optim::AdamOptions(1e-2));
  return s;
}

void set_adam_grads(AdamSetup& s, int64_t step) {
  torch::manual_seed(1000 + step);
  for (size_t i = 0; i < s.params.size(); ++i)
    s.params[i].mutable_grad() = step == 0 && i == 1 ? torch::Tensor()  // no gradient: left alone
                                                     : torch::randn(s.params[i].sizes());
}

TEST(FusedAdam, MatchesTorchAdamAndIsThreadIndependent) {
  AdamSetup fused = make_adam(5), reference = make_adam(5);
  const torch::Tensor initial = fused.params[0].detach().clone();
  const torch::Tensor untouched = fused.params[1].detach().clone();
  for (int64_t step = 0; step < 5; ++step) {
    set_adam_grads(fused, step);
    set_adam_grads(reference, step);
    adam_step(*fused.adam);
    reference.adam->step();
    if (step == 0) {
      EXPECT_TRUE(torch::equal(fused.params[1].detach(), untouched));
      EXPECT_EQ(fused.adam->state().count(fused.params[1].unsafeGetTensorImpl()), 0u);
    }
  }
  for (size_t i = 0; i < fused.params.size(); ++i) {
    // Float rounding of torch's fused multiply-adds: ~1e-7 of values of order 1.
    EXPECT_TRUE(torch::allclose(fused.params[i].detach(), reference.params[i].detach(), 1e-6,
                                1e-6))
        << i << ": max diff "
        << (fused.params[i] - reference.params[i]).abs().max().item<double>();
    const auto& a = static_cast<const torch::optim::AdamParamState&>(
        *fused.adam->state().at(fused.params[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<const torch::optim::AdamParamState&>(
        *reference.adam->state().at(reference.params[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), b.step()) << i;
    EXPECT_TRUE(torch::allclose(a.exp_avg(), b.exp_avg(), 1e-6, 1e-7)) << i;
    EXPECT_TRUE(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-6, 1e-7)) << i;
  }
  // Five steps of about lr each: the comparison is not of two untouched sets.
  EXPECT_GT((fused.params[0].detach() - initial).abs().max().item<double>(), 1e-2);

  // Bitwise the same with 1 and 2 threads.
  const int threads = at::get_num_threads();
  std::vector<torch::Tensor> results;
  for (const int n : {1, 2}) {
    at::set_num_threads(n);
    AdamSetup s = make_adam(6);
    for (int64_t step = 0; step < 3; ++step) {
      set_adam_grads(s, step);
      adam_step(*s.adam);
    }
    results.push_back(s.params[0].detach().clone());
  }
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(results[0], results[1]));
}

TEST(PhaseTimer, ChargesPhasesInOrderAndMarksTheBackward) {
  constexpr double kSleep = 0.02;
  PhaseTimer timer;
  const auto before = std::chrono::steady_clock::now();
  timer.start();
  const torch::Tensor x = torch::randn({64, 64}, torch::requires_grad());
  const torch::Tensor y = phase_mark(x.matmul(x), &timer, "matmul_bwd");
  std::this_thread::sleep_for(std::chrono::duration<double>(kSleep));
  timer.lap("matmul");
  std::this_thread::sleep_for(std::chrono::duration<double>(kSleep));
  timer.lap("matmul");  // a phase that comes again adds to its total
  y.sum().backward();
  timer.lap("rest_bwd");
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  const PhaseTimes& t = timer.times();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].first, "matmul");
  EXPECT_EQ(t[1].first, "matmul_bwd");  // charged when autograd crossed the mark
  EXPECT_EQ(t[2].first, "rest_bwd");
  EXPECT_GE(t[0].second, 2 * kSleep);  // both laps of "matmul", each after its sleep
  // The phases split the time from start() to the last lap, once each: their sum lies within
  // the wall time around them, whatever the machine's speed.
  double sum = 0.0;
  for (const auto& [name, seconds] : t) sum += seconds;
  EXPECT_LE(sum, wall + 1e-9);
  // The mark is an identity for the gradient.
  const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  x2.matmul(x2).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), x2.grad()));
  timer.start();
  EXPECT_TRUE(timer.times().empty());
  EXPECT_TRUE(phase_mark(x, nullptr, "none").is_same(x));
  const PhaseTimes median =
      median_phases({{{"a", 1.0}, {"b", 5.0}}, {{"a", 3.0}}, {{"a", 2.0}, {"b", 1.0}}});
  ASSERT_EQ(median.size(), 2u);
  EXPECT_EQ(median[0], (std::pair<std::string, double>{"a", 2.0}));
  EXPECT_EQ(median[1], (std::pair<std::string, double>{"b", 1.0}));  // missing counts 0: {5, 0, 1}
}

// The eval's chunks dealt round-robin (framework/even_slice.h): together the parts cover every
// item once, each range is one of chunk_slice's chunks (it starts at a multiple of the chunk and
// is whole but for the last), and part p's ranges are chunks p, p + parts, ...
TEST(StridedChunks, DealsChunkSliceChunksRoundRobinAndCoversEveryItemOnce) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(strided_chunks(10, 3, 0, 2), (Ranges{{0, 3}, {6, 9}}));
  EXPECT_EQ(strided_chunks(10, 3, 1, 2), (Ranges{{3, 6}, {9, 10}}));
  EXPECT_EQ(strided_chunks(4, 3, 2, 3), Ranges{});  // 2 chunks, 3 parts: the third has none
  for (int64_t n : {0, 1, 7, 768, 121706})
    for (int64_t chunk : {1, 5, 200, 2048})
      for (int64_t parts : {1, 2, 3, 4}) {
        std::vector<int> seen(static_cast<size_t>(n), 0);
        for (int64_t p = 0; p < parts; ++p) {
          int64_t index = p;  // the chunk's index among all of the view's chunks
          for (const auto& [first, last] : strided_chunks(n, chunk, p, parts)) {
            EXPECT_EQ(first, index * chunk);
            EXPECT_EQ(last, std::min(n, first + chunk));
            for (int64_t i = first; i < last; ++i) ++seen[static_cast<size_t>(i)];
            index += parts;
          }
        }
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "item " << i << " of " << n << ", chunk "
                                                     << chunk << ", " << parts << " parts";
      }
  EXPECT_THROW(strided_chunks(10, 0, 0, 1), std::invalid_argument);
  EXPECT_THROW(strided_chunks(10, 3, 2, 2), std::invalid_argument);
}

// TFRecord's checksum: CRC-32C's published check values (the nine digits; RFC 3720's 32 zero
// and 32 0xFF bytes) and the mask (rotate right by 15, add 0xa282ead8).
TEST(TensorBoardEventFile, Crc32cMatchesThePublishedValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
}

// The file is a sequence of whole records whose checksums hold: the version record first, a
// restart marker when resumed, then one record per call.
TEST(TensorBoardEventFile, WritesWholeRecordsWithTheirChecksums) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tessera-tb-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    TensorBoardEventFile file((dir / "tb").string(), /*resumed_step=*/7);
    path = file.path();
    EXPECT_EQ(fs::path(path).parent_path(), dir / "tb");
    EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
    file.scalars(nlohmann::json{{"loss", 0.5}, {"name", "text is left out"}, {"phase_s", {{"a", 1}}}}, 8);
    file.scalars(nlohmann::json{{"only", "strings"}}, 8);  // nothing to write: no record
    file.text("config", 8, "[run]");
    file.image("eval/view_000", 8, 1, 1, std::string("not checked here"));
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0, records = 0;
  std::vector<std::string> payloads;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size()) << "a partial header at byte " << at;
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(bytes.data() + at, 8)) << "record " << records;
    ASSERT_LE(at + 12 + length + 4, bytes.size()) << "record " << records << " is cut short";
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c(bytes.data() + at + 12, length)) << "record " << records;
    payloads.emplace_back(bytes.substr(at + 12, length));
    at += 12 + length + 4;
    ++records;
  }
  ASSERT_EQ(records, 5u);  // version, restart marker, scalars, text, image
  EXPECT_NE(payloads[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(payloads[2].find("phase_s/a"), std::string::npos);
  EXPECT_EQ(payloads[2].find("name"), std::string::npos);
  EXPECT_NE(payloads[4].find("not checked here"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TensorBoardEventFile, AFolderThatCannotBeMadeIsAUserError) {
  EXPECT_THROW(TensorBoardEventFile("/proc/no-such-folder/tb", 0), UserError);
}

}  // namespace
}  // namespace tessera
