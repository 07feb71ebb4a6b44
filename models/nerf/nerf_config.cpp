// The [nerf] config section: every key bound to a NerfConfig field (defaults are the fields'
// initializers), with its range and the reference text of docs/config.md.
#include "models/nerf/nerf_config.h"

#include "distributed/errors.h"

namespace tessera::models::nerf {
namespace {

using config_schema::KeySpec;
using config_schema::section_key;

// 2^26 rays: far beyond one node's memory per step; a typo guard, not a tuning limit.
constexpr double kMaxRaysPerStep = 67108864.0;

// Constants, not std::strings: a section may be built during another file's static initialization.
constexpr const char* kHash = "nerf-hash";
constexpr const char* kMlp = "nerf-mlp";

template <typename Field>
KeySpec nerf_key(const char* name, Field field) {
  return section_key<NerfConfig>(name, field);
}

}  // namespace

config_schema::SectionSpec nerf_config_section() {
  config_schema::SectionSpec section;
  section.name = NerfConfig::kSection;
  section.models = {kHash, kMlp};
  section.doc = "The batch of rays, the optimizer and each model's sizes (docs/nerf.md).";
  section.keys = {
      nerf_key("rays_per_step", [](auto& n) -> auto& { return n.rays_per_step; })
          .range(1, kMaxRaysPerStep)
          .doc("Global batch of rays per step, split evenly across ranks."),
      nerf_key("micro_batches", [](auto& n) -> auto& { return n.micro_batches; })
          .range(1, 4096)
          .doc("Gradient accumulation: micro-batches per step on each rank (same result as one batch)."),
      nerf_key("unit_rays", [](auto& n) -> auto& { return n.unit_rays; })
          .range(0, kMaxRaysPerStep)
          .doc("With run.deterministic: rays per work unit; 0 = rays_per_step / 16, at least "
               "256. The step's rays are cut into units of at most this many (sizes differing by at "
               "most one) whatever the number of "
               "ranks; each rank renders its units one at a time (micro_batches is not used) and "
               "their gradients are summed exactly (docs/training_loop.md). Larger units cost "
               "less per ray; at least one unit per rank keeps every rank busy. The unit's size "
               "is part of what a run's bits depend on; the world size is not."),
      nerf_key("lr", [](auto& n) -> auto& { return n.lr; })
          .range_open_low(0, 10)
          .doc("Peak learning rate (Adam)."),
      nerf_key("lr_schedule", [](auto& n) -> auto& { return n.lr_schedule; })
          .one_of({"constant", "exponential", "cosine"})
          .doc("Learning-rate schedule from `nerf.lr` to `nerf.final_lr` (docs/training.md)."),
      nerf_key("final_lr", [](auto& n) -> auto& { return n.final_lr; })
          .range_open_low(0, 10)
          .doc("Learning rate at the last step (exponential and cosine schedules)."),
      nerf_key("warmup_steps", [](auto& n) -> auto& { return n.warmup_steps; })
          .range(0, config_schema::kMaxSteps)
          .doc("Steps of linear learning-rate warm-up."),
      nerf_key("adam_eps", [](auto& n) -> auto& { return n.adam_eps; })
          .range(0, 1)
          .doc("Adam's epsilon (instant-ngp uses 1e-15; larger values damp the steps of weights with tiny gradients)."),
      nerf_key("background", [](auto& n) -> auto& { return n.background; })
          .one_of({"random", "dataset"})
          .doc("`random` renders each training ray over its own random color. With alpha the target is composited over the same color (nerfstudio's random background), so the model learns transparency instead of painting the background into the scene; unbounded datasets without alpha (real captures) keep the photo as target, so the model learns that every ray ends on something opaque instead of fitting a fog over the background (instant-ngp). `dataset` uses the dataset's background. No effect on bounded datasets without alpha; eval always uses the dataset's background."),
      nerf_key("pixel_jitter", [](auto& n) -> auto& { return n.pixel_jitter; })
          .doc("Each training ray passes through a random point of its pixel (a pure function of the seed, step and ray) instead of its center, as instant-ngp trains. A photo's pixel is the light over its area: rays through the centers alone fit the same points every epoch, and a new view's rays pass between them. Eval, `tessera render` and the train-view scores use the centers. Off by default; configs/capture_nerf.toml turns it on with march_jitter: together they raised eval on two real captures by 0.5 and 1.0 dB and narrowed every train-eval gap (docs/nerf.md, \"Sample positions\")."),
      nerf_key("hash_levels", [](auto& n) -> auto& { return n.hash.levels; })
          .range(1, 32).only_for({kHash})
          .doc("Levels L of the multiresolution hash grid (instant-ngp: 16)."),
      nerf_key("hash_features_per_level", [](auto& n) -> auto& { return n.hash.features_per_level; })
          .check("1, 2, 4 or 8", [](const config_schema::Value& v) -> std::string {
            const int64_t f = std::get<int64_t>(v);
            return f == 1 || f == 2 || f == 4 || f == 8 ? "" : "the kernels take 1, 2, 4 or 8";
          })
          .only_for({kHash})
          .doc("Features F per level (instant-ngp: 2, its best trade-off of quality and speed)."),
      nerf_key("hash_log2_size", [](auto& n) -> auto& { return n.hash.log2_hashmap_size; })
          .range(0, 24).only_for({kHash})
          .doc("log2 of the rows T per level (instant-ngp: 19); the table holds L * T * F parameters. 0 = from the images: the largest power of two at most the train views' pixels / 10, within 2^14 to 2^17 (larger tables train slower on a CPU), logged (a point of a capture is seen by ~10 views: with many more rows than pixels / 10, fine rows are fitted by single rays and new views see fog; with far fewer the photos blur; docs/nerf.md, \"Hash-grid weight decay and the far colour\"). Otherwise 10 to 24."),
      nerf_key("hash_base_resolution", [](auto& n) -> auto& { return n.hash.base_resolution; })
          .range(2, 1024).only_for({kHash})
          .doc("The coarsest level's resolution N_min (instant-ngp: 16)."),
      nerf_key("hash_max_resolution", [](auto& n) -> auto& { return n.hash.finest_resolution; })
          .check("0, or 16 to 65536", [](const config_schema::Value& v) -> std::string {
            const int64_t n = std::get<int64_t>(v);
            return n == 0 || (n >= 16 && n <= (1 << 16)) ? "" : "0 (from the images) or 16 to 65536";
          })
          .only_for({kHash})
          .doc("The finest level's resolution N_max over the scene box (the contracted cube of an unbounded scene). 0 = from the images: the finest cell is 2/3 of a pixel's footprint at the foreground's center (median over the cameras of distance / focal length); the run logs the value. Much finer grids let each training ray fit cells of its own, and new views see fog (docs/nerf.md, \"Generalizing to new views\"). instant-ngp: 2048 for 800 px images. Otherwise at least `hash_base_resolution`."),
      nerf_key("hash_hidden_width", [](auto& n) -> auto& { return n.hash.hidden_width; })
          .range(8, 1024).only_for({kHash})
          .doc("Width of the density and color MLPs' hidden layers (instant-ngp: 64)."),
      nerf_key("hash_geo_features", [](auto& n) -> auto& { return n.hash.geo_features; })
          .range(1, 256).only_for({kHash})
          .doc("Outputs of the density MLP (the first is the log-density, the others feed the color MLP; instant-ngp: 16)."),
      nerf_key("hash_color_layers", [](auto& n) -> auto& { return n.hash.color_hidden_layers; })
          .range(1, 8).only_for({kHash})
          .doc("Hidden layers of the color MLP (instant-ngp: 2)."),
      nerf_key("march_steps", [](auto& n) -> auto& { return n.hash.steps_per_diagonal; })
          .range(16, 4096).only_for({kHash})
          .doc("Ray-marching steps per diagonal of the scene box (of the foreground box of an unbounded scene, beyond which steps grow with distance); fewer steps are faster and blur thin surfaces (instant-ngp: 1024 in its unit cube). The grid sampler only (`sampler`)."),
      nerf_key("march_jitter", [](auto& n) -> auto& { return n.hash.march_jitter; })
          .only_for({kHash})
          .doc("Each training ray starts marching a random fraction of its first step later (a pure function of the seed, step and ray), as instant-ngp trains: its samples move by up to a step. Without it a ray's samples sit at the same depths every epoch. Eval and render march as without (docs/nerf.md, \"Sample positions\"). The grid sampler only: the proposal sampler always moves its draws in training."),
      nerf_key("distortion_weight", [](auto& n) -> auto& { return n.hash.distortion_weight; })
          .range(0.0, 1.0).only_for({kHash})
          .doc("Weight of mip-NeRF 360's distortion loss, per ray, against the photometric mean squared error; it pulls each ray's weight onto one surface (nerfacto: 0.002). Without a proposal sampler it also rewards a layer of density just in front of the camera, so configs/capture_nerf.toml leaves it off (docs/nerf.md, \"Distortion loss\"); 0 = off."),
      nerf_key("sampler", [](auto& n) -> auto& { return n.hash.sampler; })
          .one_of({"grid", "proposal"})
          .only_for({kHash})
          .doc("Where a ray's samples come from. `grid`: marched through the occupancy grid, and only those before the ray's transmittance ends are rendered (instant-ngp). `proposal`: nerfacto's proposal sampler, two small hash-grid density fields evaluated in turn along the ray, each placing the next one's samples where the last put its weight, and the radiance field renders `proposal_field_samples` a ray; the fields learn from mip-NeRF 360's interlevel loss (`interlevel_weight`), and the occupancy grid is not used (docs/nerf.md, \"Proposal sampling\")."),
      nerf_key("proposal_samples_1", [](auto& n) -> auto& { return n.hash.proposal.first_samples; })
          .range(2, 4096).only_for({kHash})
          .doc("With sampler = \"proposal\": samples a ray of the first proposal field, spread evenly in nerfacto's distance along the ray (linear out to 1 from the camera, in the frame of an unbounded scene or world units of a bounded one, like disparity beyond; nerfacto: 256)."),
      nerf_key("proposal_samples_2", [](auto& n) -> auto& { return n.hash.proposal.second_samples; })
          .range(2, 4096).only_for({kHash})
          .doc("With sampler = \"proposal\": samples a ray of the second proposal field, drawn from the first one's weights (nerfacto: 96)."),
      nerf_key("proposal_field_samples", [](auto& n) -> auto& { return n.hash.proposal.nerf_samples; })
          .range(1, 4096).only_for({kHash})
          .doc("With sampler = \"proposal\": samples a ray of the radiance field, drawn from the second proposal field's weights; every one is rendered (nerfacto: 48)."),
      nerf_key("interlevel_weight", [](auto& n) -> auto& { return n.hash.proposal.interlevel_weight; })
          .range(0.0, 100.0).only_for({kHash})
          .doc("With sampler = \"proposal\": weight of mip-NeRF 360's interlevel loss, per ray, against the photometric mean squared error; the only loss the proposal fields learn from, so 0 leaves them as initialized (nerfacto: 1)."),
      nerf_key("near_gradient_distance", [](auto& n) -> auto& { return n.hash.near_gradient_distance; })
          .range(0.0, 100.0).only_for({kHash})
          .doc("Scales the gradients of samples nearer to their camera than this distance by (t / distance)^2, leaving the render unchanged (\"Floaters No More\", Philip and Deschaintre 2023): without it, density just in front of each camera learns fastest and paints that view there, floaters that other views see as fog. In the frame of an unbounded scene, whose [-1, 1]^3 holds the foreground and the cameras, so 1 is about a camera's distance to the scene. Unbounded scenes (real captures) only. 0 = off."),
      nerf_key("hash_weight_decay", [](auto& n) -> auto& { return n.hash.weight_decay; })
          .range(0.0, 10.0).only_for({kHash})
          .doc("Weight of Zip-NeRF's normalized weight decay on the hash grid: the sum over levels of each level's mean squared feature, added once per step to the photometric loss. Under Adam a row that no ray's gradient supports decays toward zero within a few hundred steps, so a fine cell fitted by one training ray fades and new views see the coarser levels that many views agree on (docs/nerf.md, \"Hash-grid weight decay and the far colour\"). Zip-NeRF: 0.1; 0 = off."),
      nerf_key("hash_coarse_to_fine", [](auto& n) -> auto& { return n.hash.coarse_to_fine; })
          .range(0.0, 1.0).only_for({kHash})
          .doc("Switches the hash grid's levels on one after another over this fraction of the planned steps, from the coarsest third (BARF, Neuralangelo): the scene's shape settles on the coarse levels before the fine ones can fit each training ray on its own, which new views see as fog (docs/nerf.md, \"Generalizing to new views\"). Rescaled when a time budget re-plans the steps. 0 = every level from the start."),
      nerf_key("mlp_layers", [](auto& n) -> auto& { return n.mlp.layers; })
          .range(2, 32).only_for({kMlp})
          .doc("Layers of the trunk (the NeRF paper: 8)."),
      nerf_key("mlp_width", [](auto& n) -> auto& { return n.mlp.width; })
          .range(8, 4096).only_for({kMlp})
          .doc("Width of the trunk (the paper: 256)."),
      nerf_key("mlp_skip_layer", [](auto& n) -> auto& { return n.mlp.skip_layer; })
          .range(1, 31).only_for({kMlp})
          .doc("The trunk layer that takes the encoded position again beside its input (the paper: 4); less than `mlp_layers`."),
      nerf_key("mlp_color_width", [](auto& n) -> auto& { return n.mlp.color_width; })
          .range(8, 4096).only_for({kMlp})
          .doc("Width of the color head (the paper: 128)."),
      nerf_key("mlp_samples_per_ray", [](auto& n) -> auto& { return n.mlp.samples_per_ray; })
          .range(1, 4096).only_for({kMlp})
          .doc("Stratified samples per ray (the paper's coarse N_c: 64; no fine level)."),
      nerf_key("mlp_position_frequencies", [](auto& n) -> auto& { return n.mlp.position_frequencies; })
          .range(0, 32).only_for({kMlp})
          .doc("Frequencies L of the position's encoding (the paper: 10)."),
      nerf_key("mlp_direction_frequencies", [](auto& n) -> auto& { return n.mlp.direction_frequencies; })
          .range(0, 32).only_for({kMlp})
          .doc("Frequencies L of the direction's encoding (the paper: 4)."),
  };
  return section;
}

void check_nerf_config(const NerfConfig& config, const std::string& origin) {
  const std::string where = origin.empty() ? "" : origin + ": ";
  if (config.hash.finest_resolution != 0 &&
      config.hash.finest_resolution < config.hash.base_resolution)
    throw UserError(where + "nerf.hash_max_resolution (" +
                    std::to_string(config.hash.finest_resolution) +
                    ") must be at least nerf.hash_base_resolution (" +
                    std::to_string(config.hash.base_resolution) + ")");
  if (config.hash.log2_hashmap_size != 0 && config.hash.log2_hashmap_size < 10)
    throw UserError(where + "nerf.hash_log2_size (" + std::to_string(config.hash.log2_hashmap_size) +
                    ") must be 0 (from the images) or 10 to 24");
  if (config.mlp.skip_layer >= config.mlp.layers)
    throw UserError(where + "nerf.mlp_skip_layer (" + std::to_string(config.mlp.skip_layer) +
                    ") must be less than nerf.mlp_layers (" + std::to_string(config.mlp.layers) +
                    ")");
}

}  // namespace tessera::models::nerf
