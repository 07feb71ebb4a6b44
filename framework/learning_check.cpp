// LearningCheck (learning_check.h): a plateau test on the loss and the causes it names.
#include "framework/learning_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace tessera {

namespace {

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

LearningCheck::LearningCheck(int64_t after, std::string family_causes)
    : after_(after), family_causes_(std::move(family_causes)) {}

std::optional<std::string> LearningCheck::observe(int64_t step, double loss) {
  if (after_ <= 0 || done_) return std::nullopt;
  if (first_step_ < 0) first_step_ = step;
  if (!std::isfinite(loss)) return std::nullopt;  // skipped steps have their own policy
  const int64_t window = std::min<int64_t>(kWindow, std::max<int64_t>(1, after_ / 4));
  const int64_t warmup = after_ / kWarmupDivisor;
  if (step >= first_step_ + warmup && static_cast<int64_t>(first_.size()) < window)
    first_.push_back(loss);
  last_.push_back(loss);
  if (static_cast<int64_t>(last_.size()) > window) last_.erase(last_.begin());
  if (step + 1 < first_step_ + after_) return std::nullopt;
  done_ = true;
  const double before = mean(first_), now = mean(last_);
  if (now <= (1.0 - kMinImprovement) * before) return std::nullopt;
  char head[256];
  std::snprintf(head, sizeof(head),
                "the loss is not improving: mean %.4g over steps %lld-%lld, %.4g over the last "
                "%lld of %lld steps. Likely causes: ",
                before, static_cast<long long>(warmup + 1), static_cast<long long>(warmup + window),
                now, static_cast<long long>(window), static_cast<long long>(after_));
  return std::string(head) + family_causes_;
}

std::string capture_not_learning_causes(const std::string& more) {
  return "(1) poses: a wrong convention or scale makes the views disagree (`tessera info` shows "
         "where the cameras sit; transforms.json is OpenGL, COLMAP is OpenCV); "
         "(2) bounds: the scene must lie in the dataset's scene_bounds and its backgrounds in "
         "scene_extent (re-import without --keep-coordinates, or give aabb_scale / COLMAP "
         "points); (3) background: a capture without alpha has no white background to fall back "
         "on; " + more + " See docs/datasets.md, \"Training your own capture\".";
}

std::optional<std::string> overfitting_warning(double eval_psnr, double train_psnr,
                                               const std::string& family_causes) {
  const double gap = train_psnr - eval_psnr;
  if (!(gap > kOverfitGapDb)) return std::nullopt;
  char head[256];
  std::snprintf(head, sizeof(head),
                "eval PSNR %.2f dB is %.1f dB below the train views' %.2f dB: the model fits the "
                "views it trains on without the scene's geometry, and new views show it (fog, "
                "floaters, blur). Likely causes: ",
                eval_psnr, gap, train_psnr);
  return std::string(head) +
         "(1) coverage: views that each see a part of the scene from one side only (sparse, "
         "clustered or forward-facing captures) leave every point fitted by one or two views; "
         "(2) poses: views that disagree slightly are fitted one by one instead of together "
         "(check the capture's registration); (3) the val views lie outside the train views' "
         "range (the split: every 8th image by default, `tessera convert --split-every`); " +
         family_causes + " See docs/datasets.md, \"Training your own capture\".";
}

}  // namespace tessera
