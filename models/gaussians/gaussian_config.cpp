// The [gaussians] config section: INRIA 3DGS's hyperparameters (learning rates, densification,
// SH schedule, loss) and Tessera's batching and resolution keys, each bound to a field of
// GaussianConfig (defaults are the fields' initializers), with the text of docs/config.md.
#include "models/gaussians/gaussian_config.h"


namespace tessera::models::gaussians {
namespace {

using config_schema::KeySpec;
using config_schema::kMaxSteps;

template <typename Field>
KeySpec gs_key(const char* name, Field field) {
  return config_schema::section_key<GaussianConfig>(name, field);
}

}  // namespace

std::vector<std::string> gaussian_shared_keys() {
  // The sampling schedule draws views; no learning-rate rescaling, no named segments (the budget
  // policy sets the views per pass) and no gradient buckets (the Gaussians are sharded).
  return {"sampling.schedule",   "sampling.rate_max", "sampling.rate_min", "sampling.step_every",
          "sampling.step_factor", "checkpoint.policy", "checkpoint.budget_mib"};
}

config_schema::SectionSpec gaussian_config_section() {
  config_schema::SectionSpec section;
  section.name = GaussianConfig::kSection;
  section.models = {GaussianConfig::kSection};
  section.doc = "3D Gaussian Splatting (docs/gaussians.md): INRIA's learning rates, "
                "densification and SH schedule under their INRIA names where they have one, and "
                "the view batch.";
  section.keys = {
      gs_key("views_per_step", [](auto& g) -> auto& { return g.views_per_step; })
          .range(1, 4096)
          .doc("Training views per step (the view batch); learning rates scale with its square root (see `lr_sqrt_batch`)."),
      gs_key("views_per_pass", [](auto& g) -> auto& { return g.views_per_pass; })
          .range(0, 4096)
          .doc("Views of a batch rendered and backpropagated together, their gradients accumulated; 0 = as many as [checkpoint] budget_mib allows per rank when policy = \"budget\", else the whole batch."),
      gs_key("resolution_scale", [](auto& g) -> auto& { return g.resolution_scale; })
          .range(1, 64)
          .doc("Render and compare at width/scale x height/scale."),
      gs_key("num_downscales", [](auto& g) -> auto& { return g.num_downscales; })
          .range(0, 8)
          .doc("Coarse to fine: train at resolution_scale x 2^n at first, halving the downscale every resolution_schedule steps (0 = full resolution throughout)."),
      gs_key("resolution_schedule", [](auto& g) -> auto& { return g.resolution_schedule; })
          .range(1, kMaxSteps)
          .doc("Steps between halvings of the coarse-to-fine downscale."),
      gs_key("init_ply", [](auto& g) -> auto& { return g.init_ply; })
          .doc("Start from this INRIA-layout .ply (e.g. `tessera export`) instead of the dataset's points."),
      gs_key("random_count", [](auto& g) -> auto& { return g.init.random_count; })
          .range(1, int64_t{1} << 31)
          .doc("Gaussians drawn at random when the dataset has no points (no SfM points, no `init_ply`): in the scene bounds, and half of them out to the scene extent for an unbounded capture (docs/gaussians.md)."),
      gs_key("stereo_init", [](auto& g) -> auto& { return g.stereo_init; })
          .doc("Without SfM points (and without `init_ply`): place up to 3/4 of `random_count` on the surfaces the train views agree on, by plane-sweep stereo with the capture's poses, coloured by the pixels; the rest random (docs/gaussians.md, \"Initialization\"). false: all random."),
      gs_key("stereo_min_ncc", [](auto& g) -> auto& { return g.stereo.min_ncc; })
          .range(-1, 1)
          .doc("The match quality stereo_init keeps: the mean normalized cross-correlation of a pixel's 5x5 patch with its two best-agreeing neighbour views."),
      gs_key("sh_degree", [](auto& g) -> auto& { return g.max_sh_degree; })
          .range(0, 3)
          .doc("Highest spherical-harmonics degree of the colors (INRIA `sh_degree`)."),
      gs_key("sh_degree_interval", [](auto& g) -> auto& { return g.sh_degree_interval; })
          .range(1, kMaxSteps)
          .doc("The SH degree rises by one every this many steps, up to `sh_degree` (INRIA: 1000)."),
      gs_key("ssim_weight", [](auto& g) -> auto& { return g.ssim_weight; })
          .range(0, 1)
          .doc("Loss = (1 - w) L1 + w (1 - SSIM) (INRIA `lambda_dssim`)."),
      gs_key("opacity_reg", [](auto& g) -> auto& { return g.opacity_reg; })
          .range(0, 1)
          .doc("Weight of the opacity regularizer: this times the mean opacity of all Gaussians is added to the loss (gsplat `opacity_reg`, from 3DGS-MCMC), so Gaussians no train view needs, such as those hidden behind surfaces from every view, fade and are pruned instead of floating into novel views. 0: none (INRIA)."),
      gs_key("lr_means", [](auto& g) -> auto& { return g.rates.means_init; })
          .range_open_low(0, 1)
          .doc("Learning rate of the positions at step 0, times the scene extent (INRIA `position_lr_init`)."),
      gs_key("lr_means_final", [](auto& g) -> auto& { return g.rates.means_final; })
          .range_open_low(0, 1)
          .doc("... decaying log-linearly to this, times the extent (INRIA `position_lr_final`) ..."),
      gs_key("lr_means_decay_steps", [](auto& g) -> auto& { return g.rates.means_decay_steps; })
          .range(1, kMaxSteps)
          .doc("... over this many steps, constant after (INRIA `position_lr_max_steps`)."),
      gs_key("lr_scales", [](auto& g) -> auto& { return g.rates.scales; })
          .range(0, 10)
          .doc("Learning rate of the log-scales (INRIA `scaling_lr`)."),
      gs_key("lr_quats", [](auto& g) -> auto& { return g.rates.quats; })
          .range(0, 10)
          .doc("Learning rate of the rotations (INRIA `rotation_lr`)."),
      gs_key("lr_opacities", [](auto& g) -> auto& { return g.rates.opacities; })
          .range(0, 10)
          .doc("Learning rate of the opacity logits (INRIA `opacity_lr`; gsplat and INRIA's first release: 0.05, INRIA's later repository: 0.025)."),
      gs_key("lr_sh_dc", [](auto& g) -> auto& { return g.rates.sh_dc; })
          .range(0, 10)
          .doc("Learning rate of the SH degree-0 colors (INRIA `feature_lr`)."),
      gs_key("lr_sh_rest", [](auto& g) -> auto& { return g.rates.sh_rest; })
          .range(0, 10)
          .doc("Learning rate of the higher SH bands (INRIA: `feature_lr` / 20)."),
      gs_key("lr_sqrt_batch", [](auto& g) -> auto& { return g.sqrt_batch_lr_scaling; })
          .doc("Multiply every learning rate by sqrt(views_per_step) (Grendel-GS's and gsplat's batch rule)."),
      gs_key("adam_eps", [](auto& g) -> auto& { return g.rates.adam_eps; })
          .range(0, 1)
          .doc("Adam's epsilon (INRIA and gsplat: 1e-15)."),
      gs_key("densify_from", [](auto& g) -> auto& { return g.densify.densify_from; })
          .range(0, kMaxSteps)
          .doc("Densify after this step ... (INRIA `densify_from_iter`)"),
      gs_key("densify_until", [](auto& g) -> auto& { return g.densify.densify_until; })
          .range(0, kMaxSteps)
          .doc("... and before this step ... (INRIA `densify_until_iter`)"),
      gs_key("densify_every", [](auto& g) -> auto& { return g.densify.densify_every; })
          .range(1, kMaxSteps)
          .doc("... every this many steps: clone, split, prune (INRIA `densification_interval`)."),
      gs_key("densify_grad_threshold", [](auto& g) -> auto& { return g.densify.grad_threshold; })
          .range_open_low(0, 1)
          .doc("Mean screen-space gradient norm (NDC units) above which a Gaussian is cloned or split (INRIA `densify_grad_threshold`)."),
      gs_key("percent_dense", [](auto& g) -> auto& { return g.densify.percent_dense; })
          .range_open_low(0, 1)
          .doc("A Gaussian to densify whose largest scale is at most this times the scene extent is cloned, a larger one split (INRIA `percent_dense`)."),
      gs_key("min_opacity", [](auto& g) -> auto& { return g.densify.prune_opacity; })
          .range(0, 1)
          .doc("Densification prunes Gaussians less opaque than this (INRIA: 0.005)."),
      gs_key("max_screen_radius", [](auto& g) -> auto& { return g.densify.max_screen_radius; })
          .range_open_low(0, 1e6)
          .doc("After the first opacity reset, densification prunes Gaussians whose screen radius since the last densification exceeded this many pixels (INRIA: 20) ..."),
      gs_key("max_world_scale", [](auto& g) -> auto& { return g.densify.max_world_scale; })
          .range_open_low(0, 1e3)
          .doc("... or whose largest scale exceeds this times the scene extent (INRIA: 0.1)."),
      gs_key("opacity_reset_every", [](auto& g) -> auto& { return g.densify.opacity_reset_every; })
          .range(1, kMaxSteps)
          .doc("Opacity reset cadence while densifying (INRIA `opacity_reset_interval`) ..."),
      gs_key("reset_opacity", [](auto& g) -> auto& { return g.densify.reset_opacity; })
          .range_open_low(0, 1)
          .doc("... which caps every opacity at this (INRIA: 0.01)."),
  };
  return section;
}

}  // namespace tessera::models::gaussians
