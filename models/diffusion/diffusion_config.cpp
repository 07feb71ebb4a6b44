// The [diffusion] config section: every key bound to a DiffusionConfig field.
#include "models/diffusion/diffusion_config.h"

#include "distributed/errors.h"

namespace tessera::models::diffusion {
namespace {

using config_schema::KeySpec;

template <typename Field>
KeySpec diffusion_key(const char* name, Field field) {
  return config_schema::section_key<DiffusionConfig>(name, field);
}

}  // namespace

std::vector<std::string> diffusion_shared_keys() {
  // No sampling schedule (every step draws `batch` shapes) and no named segments: the
  // checkpoint policies work on transformer blocks (docs/diffusion.md, "Memory").
  return {"checkpoint.policy", "checkpoint.budget_mib", "distributed.first_bucket_mib",
          "distributed.bucket_mib"};
}

config_schema::SectionSpec diffusion_config_section() {
  config_schema::SectionSpec section;
  section.name = DiffusionConfig::kSection;
  section.models = {"point-diffusion"};
  section.doc = "A Point-E-style transformer that denoises point clouds (docs/diffusion.md), "
                "trained on a tessera-shapes dataset (`tessera synth --preset shapes`).";
  section.keys = {
      diffusion_key("width", [](auto& o) -> auto& { return o.width; })
          .range(8, 8192)
          .doc("Width of the transformer (channels per token); a multiple of `heads`."),
      diffusion_key("depth", [](auto& o) -> auto& { return o.depth; })
          .range(1, 256)
          .doc("Transformer blocks."),
      diffusion_key("heads", [](auto& o) -> auto& { return o.heads; })
          .range(1, 256)
          .doc("Attention heads per block."),
      diffusion_key("tokens", [](auto& o) -> auto& { return o.tokens; })
          .range(1, 1 << 20)
          .doc("Points per shape the model sees (one token each): the first `tokens` of the dataset's points, which are uniform on the surface; at most the dataset's points per shape."),
      diffusion_key("dropout", [](auto& o) -> auto& { return o.dropout; })
          .range(0, 0.9)
          .doc("Dropout after attention and in the MLPs (0 = off)."),
      diffusion_key("timesteps", [](auto& o) -> auto& { return o.timesteps; })
          .range(2, 100000)
          .doc("Noise levels T of the cosine schedule (Nichol & Dhariwal; Point-E: 1024)."),
      diffusion_key("batch", [](auto& o) -> auto& { return o.batch; })
          .range(1, 1 << 20)
          .doc("Shapes per step, split evenly across ranks; each has its own noise level and noise."),
      diffusion_key("micro_batches", [](auto& o) -> auto& { return o.micro_batches; })
          .range(1, 4096)
          .doc("Gradient accumulation: micro-batches per step on each rank (same result as one batch)."),
      diffusion_key("unit_shapes", [](auto& o) -> auto& { return o.unit_shapes; })
          .range(0, 1 << 20)
          .doc("With run.deterministic: shapes per work unit; 0 = batch / 16, at least 4. The "
               "batch is cut into units of at most this many (sizes differing by at most one) "
               "whatever the number of ranks; each rank "
               "runs its units one at a time (micro_batches is not used) and their gradients "
               "are summed exactly (docs/training_loop.md). At least one unit per rank keeps "
               "every rank busy."),
      diffusion_key("lr", [](auto& o) -> auto& { return o.lr; })
          .range_open_low(0, 10)
          .doc("Peak learning rate (Adam)."),
      diffusion_key("lr_schedule", [](auto& o) -> auto& { return o.lr_schedule; })
          .one_of({"constant", "exponential", "cosine"})
          .doc("Learning-rate schedule from `diffusion.lr` to `diffusion.final_lr` (docs/training.md)."),
      diffusion_key("final_lr", [](auto& o) -> auto& { return o.final_lr; })
          .range_open_low(0, 10)
          .doc("Learning rate at the last step (exponential and cosine schedules)."),
      diffusion_key("warmup_steps", [](auto& o) -> auto& { return o.warmup_steps; })
          .range(0, config_schema::kMaxSteps)
          .doc("Steps of linear learning-rate warm-up."),
      diffusion_key("adam_eps", [](auto& o) -> auto& { return o.adam_eps; })
          .range(0, 1)
          .doc("Adam's epsilon."),
      diffusion_key("sampler", [](auto& o) -> auto& { return o.sampler; })
          .one_of({"ddpm", "ddim"})
          .doc("Sampler of `tessera sample` (its default) and of eval's generative metrics, on `sample_steps` evenly spaced levels: DDPM's ancestral sampler, or DDIM (eta 0, deterministic given the start noise; a small model's DDIM samples are smoother than the data, see docs/diffusion.md)."),
      diffusion_key("sample_steps", [](auto& o) -> auto& { return o.sample_steps; })
          .range(1, 100000)
          .doc("Denoising steps of a sample (one denoiser forward each); at most `timesteps`."),
      diffusion_key("generative_eval", [](auto& o) -> auto& { return o.generative_eval; })
          .doc("Eval also draws as many samples as it scores shapes and reports MMD, COV and 1-NNA (Chamfer distance) of the samples against those shapes, besides the held-out denoising loss; costs `sample_steps` forwards per sample."),
  };
  return section;
}

void check_diffusion_options(const DiffusionConfig& o, const std::string& origin) {
  const std::string where = origin.empty() ? "" : origin + ": ";
  if (o.width % o.heads != 0)
    throw UserError(where + "diffusion.width (" + std::to_string(o.width) +
                    ") must be a multiple of diffusion.heads (" + std::to_string(o.heads) + ")");
  if (o.sample_steps > o.timesteps)
    throw UserError(where + "diffusion.sample_steps (" + std::to_string(o.sample_steps) +
                    ") must not exceed diffusion.timesteps (" + std::to_string(o.timesteps) + ")");
}

}  // namespace tessera::models::diffusion
