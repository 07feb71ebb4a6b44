// Notices a run that is not learning: the mean loss of the last steps compared with that of the
// first steps after a few hundred steps, and a warning that names the likely causes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

class LearningCheck {
 public:
  // Steps averaged at each end: long enough to smooth one batch's noise, short next to `after`.
  static constexpr int64_t kWindow = 50;
  // The first window starts after this fraction of `after`: in the first steps any model, even
  // one that learns nothing, falls from its initial loss to the images' mean color, and that
  // transient must not count as learning.
  static constexpr int64_t kWarmupDivisor = 6;
  // The last window's mean must be at least this much below the first window's: a model that
  // learns anything at all cuts its photometric loss by far more than 10% in a few hundred steps.
  static constexpr double kMinImprovement = 0.10;

  // `after` = 0 disables the check. `family_causes` is the family's numbered list of likely
  // causes (ModelFamily::not_learning_causes); families that train on captured views start it
  // with capture_not_learning_causes().
  LearningCheck(int64_t after, std::string family_causes);

  // Called every step with that step's loss (identical on every rank). Returns the warning once,
  // at `first step + after`, when the mean loss of the last window is not kMinImprovement below
  // that of the window starting `after / kWarmupDivisor` steps in; nothing otherwise.
  std::optional<std::string> observe(int64_t step, double loss);

 private:
  int64_t after_;
  std::string family_causes_;
  int64_t first_step_ = -1;
  bool done_ = false;
  std::vector<double> first_, last_;  // the first window after the warm-up, the newest losses
};

// The likely causes every family that trains on captured views shares, (1) poses, (2) bounds and
// (3) background, then `more` (the family's own, numbered from 4), then where to read more.
std::string capture_not_learning_causes(const std::string& more);

// Eval PSNR this far (dB) below the train views' warns (TrainingRun::evaluate): a model that
// learned the scene renders a view it has not seen a few dB worse than one it trained on, not more.
constexpr double kOverfitGapDb = 6.0;

// The warning for an eval PSNR more than kOverfitGapDb below the train views' PSNR, naming the
// likely causes: those of any family trained on captured views, numbered (1)-(3), then
// `family_causes` (ModelFamily::overfitting_causes). nullopt when the gap is smaller.
std::optional<std::string> overfitting_warning(double eval_psnr, double train_psnr,
                                               const std::string& family_causes);

// `k` of `views`, spread evenly over them (views next to each other in a capture look alike):
// views[i * n / k] for i < k; all of them when k >= n, none when k <= 0. Of any kind of view
// (indices, or a render's named cameras).
template <typename View>
std::vector<View> spread_views(const std::vector<View>& views, int64_t k) {
  const size_t n = views.size();
  const size_t m = k <= 0 ? 0 : std::min(n, static_cast<size_t>(k));
  std::vector<View> out;
  out.reserve(m);
  for (size_t i = 0; i < m; ++i) out.push_back(views[i * n / m]);
  return out;
}
// Camera indices (also takes a braced list).
inline std::vector<size_t> spread_views(const std::vector<size_t>& views, int64_t k) {
  return spread_views<size_t>(views, k);
}

}  // namespace tessera
