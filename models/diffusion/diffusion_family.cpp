// The point-diffusion family: DDPM training of the PointDenoiser on tessera-shapes, with per-shape
// randomness keyed by (seed, step, position in the batch) so that N ranks train like one.
#include "models/diffusion/diffusion_family.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/adam_state.h"
#include "framework/autocast.h"
#include "framework/data/import.h"
#include "framework/even_slice.h"
#include "framework/memory.h"
#include "framework/metrics.h"
#include "framework/run.h"

namespace tessera::models::diffusion {

namespace {

// Purposes of the counter-based randomness: which shapes an epoch visits, and each sample's
// noise level and noise.
constexpr uint64_t kEpochPurpose = 0x45504f4348ull;  // "EPOCH"
constexpr uint64_t kNoisePurpose = 0x4e4f495345ull;  // "NOISE"
constexpr uint64_t kEvalPurpose = 0x4556414cull;     // "EVAL"
constexpr uint64_t kEvalSamplePurpose = 0x4556534dull;  // "EVSM": eval's generated clouds
constexpr uint64_t kSamplePurpose = 0x53414d50ull;      // "SAMP": `tessera sample`
constexpr uint64_t kDropoutPurpose = 0x44524f50ull;     // "DROP": a work unit's dropout
// Clouds denoised together by draw_samples (bounds the memory of sampling, not its result).
constexpr int64_t kSampleChunk = 16;
constexpr int64_t kChannels = 6;                     // xyz, rgb

uint64_t mix(uint64_t a, uint64_t b) {  // SplitMix64 of the pair: decorrelated, platform-exact
  uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

torch::Generator generator(uint64_t seed, uint64_t purpose, uint64_t a, uint64_t b) {
  return at::make_generator<at::CPUGeneratorImpl>(mix(mix(mix(seed, purpose), a), b));
}

const data::shapes::ShapesReader& shapes_of(const FamilyContext& c) {
  const data::shapes::ShapesReader* shapes = c.dataset.as_shapes();
  if (!shapes) throw std::logic_error("point-diffusion: the dataset is not a tessera-shapes file");
  return *shapes;
}

}  // namespace

DiffusionFamily::DiffusionFamily(const FamilyContext& c)
    : DataParallelFamily(c.process, c.comm, c.device),
      comm_(c.comm),
      shapes_(shapes_of(c)),
      options_(c.config.section<DiffusionConfig>()),
      seed_(static_cast<uint64_t>(c.config.run.seed)),
      device_(c.device),
      policy_(parse_recompute_policy(c.config.checkpoint.policy)),
      policy_name_(c.config.checkpoint.policy),
      precision_(c.config.train.precision),
      schedule_(options_.timesteps),
      lr_(lr_schedule_options(options_, c.config.train.steps)),
      train_(shapes_.indices(data::Split::Train)) {
  check_diffusion_options(options_, c.config.source_path);
  if (options_.tokens > shapes_.points_per_shape())
    throw UserError(shapes_.path() + ": diffusion.tokens = " + std::to_string(options_.tokens) +
                    " is more than its " + std::to_string(shapes_.points_per_shape()) +
                    " points per shape");
  if (train_.empty()) throw UserError(shapes_.path() + ": no shape in the train split");
  if (!c.config.run.deterministic && options_.batch < comm_.size() * options_.micro_batches)
    throw UserError("diffusion.batch = " + std::to_string(options_.batch) + " gives fewer shapes " +
                    "per rank than diffusion.micro_batches = " +
                    std::to_string(options_.micro_batches) + " on " +
                    std::to_string(comm_.size()) + " rank(s)");
  DenoiserOptions d;
  d.width = options_.width;
  d.depth = options_.depth;
  d.heads = options_.heads;
  d.channels = kChannels;
  d.dropout = options_.dropout;
  model_ = std::make_unique<PointDenoiser>(d, seed_, device_);
  const auto [first, last] = even_slice(options_.batch, comm_.rank(), comm_.size());
  const int64_t mine = last - first;
  micro_shapes_ = c.config.run.deterministic  // shapes per forward: a unit, or a micro-batch
                      ? std::min(unit_shapes(), options_.batch)
                      : (mine + options_.micro_batches - 1) / options_.micro_batches;
  plan_recompute(c.config);
  distributed::GradientSyncOptions sync;
  constexpr double kMiB = 1024.0 * 1024.0;
  sync.first_bucket_bytes = static_cast<int64_t>(c.config.distributed.first_bucket_mib * kMiB);
  sync.bucket_bytes = static_cast<int64_t>(c.config.distributed.bucket_mib * kMiB);
  init_optimizer({model_->parameters()},
                 torch::optim::AdamOptions(options_.lr).eps(options_.adam_eps), sync,
                 options_.micro_batches, c.config.run.deterministic);
}

DiffusionFamily::~DiffusionFamily() = default;

SegmentInfo DiffusionFamily::measure_block(const std::string& precision) {
  return diffusion::measure_block(*model_, micro_shapes_, options_.tokens, precision, device_);
}

void DiffusionFamily::plan_recompute(const Config& config) {
  recompute_ = Recompute{};
  switch (policy_) {
    case RecomputePolicy::None: break;
    case RecomputePolicy::Attention: recompute_.attention = true; break;
    case RecomputePolicy::Blocks: recompute_.blocks.assign(options_.depth, true); break;
    case RecomputePolicy::Budget: {
      const CheckpointPlan plan = plan_block_budget(measure_block(config.train.precision),
                                                    options_.depth, config.checkpoint.budget_mib);
      recompute_.blocks = plan.checkpointed;
      checkpoint_plan_ = plan.text;
      if (!plan.fits)
        spdlog::warn("activation checkpointing: checkpoint.budget_mib = {} cannot be met by any "
                     "choice of blocks; recomputing those of the lowest peak (see the plan)",
                     config.checkpoint.budget_mib);
      break;
    }
  }
}

int64_t DiffusionFamily::measure_activation_bytes(const std::string& precision) {
  return measure_forward(*model_, micro_shapes_, options_.tokens, options_.timesteps, recompute_,
                         precision, device_);
}

void DiffusionFamily::set_total_steps(int64_t steps) {
  LrScheduleOptions lr = lr_schedule_options(options_, std::max<int64_t>(1, steps));
  lr.warmup_steps = std::min(lr.warmup_steps, lr.total_steps);  // a plan shorter than warm-up
  lr_ = LrSchedule{lr};
}

void DiffusionFamily::on_start(int64_t first_step) {
  spdlog::info("point-diffusion: {} parameters (width {}, depth {}, heads {}), {} tokens, "
               "batch {} shapes over {} rank(s), {} train shapes, from step {}",
               model_->parameter_count(), options_.width, options_.depth, options_.heads,
               options_.tokens, options_.batch, comm_.size(), train_.size(), first_step);
  if (!checkpoint_plan_.empty()) spdlog::info("{}", checkpoint_plan_);
  // The memory this rank needs, by kind (as torch.cuda.memory_summary splits it): parameters,
  // their gradients and Adam's two moments are fp32 whatever the precision; the activations are
  // those one micro-batch's forward stores until backward under the checkpoint policy.
  const int64_t params = model_->parameter_count() * static_cast<int64_t>(sizeof(float));
  int64_t activations = -1;
  try {
    activations = measure_activation_bytes(precision_);
  } catch (const std::runtime_error&) {  // this device's memory cannot be measured
  }
  const int64_t total = 4 * params + std::max<int64_t>(activations, 0);
  spdlog::info(
      "memory of rank {} ({} shapes x {} tokens per micro-batch, {}, checkpoint.policy {}):\n"
      "  parameters        {:>10}\n  gradients         {:>10}\n  optimizer (Adam)  {:>10}\n"
      "  activations       {:>10}\n  total             {:>10}",
      comm_.rank(), micro_shapes_, options_.tokens, precision_,
      policy_name_, format_bytes(params), format_bytes(params),
      format_bytes(2 * params), activations < 0 ? "unmeasured" : format_bytes(activations),
      format_bytes(total));
}

std::vector<int64_t> DiffusionFamily::batch_shapes(int64_t step) {
  // Position p of the stream of samples is step * batch + j; epoch p / n visits the train shapes
  // in its own permutation.
  const int64_t n = static_cast<int64_t>(train_.size());
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < options_.batch; ++j) {
    const int64_t position = step * options_.batch + j;
    const int64_t epoch = position / n;
    auto it = epochs_.find(epoch);
    if (it == epochs_.end()) {
      if (epochs_.size() > 2) epochs_.erase(epochs_.begin());  // steps only move forward
      torch::Generator gen = generator(seed_, kEpochPurpose, static_cast<uint64_t>(epoch), 0);
      const torch::Tensor order = torch::randperm(n, gen, torch::kInt64);
      const int64_t* index = order.data_ptr<int64_t>();
      std::vector<int64_t> perm(n);
      for (int64_t i = 0; i < n; ++i) perm[i] = static_cast<int64_t>(train_[index[i]]);
      it = epochs_.emplace(epoch, std::move(perm)).first;
    }
    ids.push_back(it->second[position % n]);
  }
  return ids;
}

torch::Tensor DiffusionFamily::clean_points(const std::vector<int64_t>& ids) const {
  const data::shapes::ShapeBatch batch = shapes_.read(ids);
  const int64_t tokens = options_.tokens;
  return torch::cat({batch.points.narrow(1, 0, tokens), batch.colors.narrow(1, 0, tokens) * 2 - 1},
                    2)
      .to(device_);
}

double DiffusionFamily::begin_step(const StepControl& control) {
  step_lr_ = lr_.at(control.step);
  step_shapes_ = batch_shapes(control.step);
  return step_lr_;
}

DataParallelFamily::MicroBatchLoss DiffusionFamily::micro_batch_loss(const StepControl& control,
                                                                     int64_t k, int64_t count) {
  const auto [begin, end] = even_slice(options_.batch, comm_.rank(), comm_.size());  // this rank's
  return shapes_loss(control, begin + (end - begin) * k / count,
                     begin + (end - begin) * (k + 1) / count);
}

int64_t DiffusionFamily::unit_shapes() const {
  return options_.unit_shapes > 0 ? options_.unit_shapes
                                  : std::max<int64_t>(4, options_.batch / 16);
}

int64_t DiffusionFamily::work_units() const {
  return (options_.batch + unit_shapes() - 1) / unit_shapes();
}

DataParallelFamily::MicroBatchLoss DiffusionFamily::unit_loss(const StepControl& control,
                                                              int64_t unit, int64_t units) {
  const auto [lo, hi] = even_slice(options_.batch, unit, units);
  if (options_.dropout > 0.0 && device_.is_cpu()) {
    // Dropout draws from torch's default generator: seeded from (seed, step, unit), so that the
    // unit drops the same activations on whichever rank runs it. (CUDA's generator is not.)
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(mix(mix(mix(seed_, kDropoutPurpose), static_cast<uint64_t>(control.step)),
                             static_cast<uint64_t>(unit)));
  }
  return shapes_loss(control, lo, hi);
}

DataParallelFamily::MicroBatchLoss DiffusionFamily::shapes_loss(const StepControl& control,
                                                                int64_t lo, int64_t hi) {
  const int64_t step = control.step;
  const std::vector<int64_t> micro_ids(step_shapes_.begin() + lo, step_shapes_.begin() + hi);
  const torch::Tensor x0 = clean_points(micro_ids);
  std::vector<torch::Tensor> levels, noises;
  for (int64_t j = lo; j < hi; ++j) {  // each sample's randomness: (seed, step, j) only
    torch::Generator gen = generator(seed_, kNoisePurpose, static_cast<uint64_t>(step),
                                     static_cast<uint64_t>(j));
    levels.push_back(torch::randint(options_.timesteps, {1}, gen, torch::kInt64));
    noises.push_back(torch::randn({options_.tokens, kChannels}, gen, torch::kFloat32));
  }
  const torch::Tensor t = torch::cat(levels).to(device_);
  const torch::Tensor noise = torch::stack(noises).to(device_);
  const torch::Tensor xt = schedule_.add_noise(x0, t, noise);
  phases().lap("data");
  torch::Tensor per_sample, predicted_f32;
  {
    AutocastScope autocast(control.precision, device_);
    Recompute recompute = recompute_;
    recompute.phases = &phases();  // recomputes charged as "recompute", not "backward"
    const torch::Tensor predicted = model_->forward(xt, t, /*training=*/true, recompute);
    predicted_f32 = predicted.to(torch::kFloat32);
    per_sample = (predicted_f32 - noise).pow(2).mean({1, 2});
  }
  // The global loss is the mean over the batch: this rank's share is its sum / batch.
  MicroBatchLoss loss;
  loss.loss = per_sample.sum() / static_cast<double>(options_.batch);
  if (deterministic() && device_.is_cpu()) {  // the value at any thread count
    const torch::Tensor squared = (predicted_f32 - noise).pow(2).detach();
    double sum = 0.0;
    for (int64_t s = 0; s < squared.size(0); ++s)
      sum += ordered_sum(squared[s]) / static_cast<double>(squared[s].numel());
    loss.reported = torch::tensor(static_cast<float>(sum / static_cast<double>(options_.batch)));
  }
  return loss;
}

void DiffusionFamily::end_step(StepRecord& record) {
  record.work = static_cast<double>(options_.batch);
  record.fields = {{"lr", step_lr_}};
  char progress[32];
  std::snprintf(progress, sizeof progress, "lr %.1e", step_lr_);
  record.progress = progress;
}

EvalScores DiffusionFamily::evaluate(int64_t, const std::vector<size_t>& items, const ImageSink&) {
  torch::NoGradGuard no_grad;
  const auto threads = bitwise_threads();  // the same scores at any thread count
  // Each item's loss from the one rank that scores it, the others' 0: the allreduce is exact, and
  // the mean adds the items in their order, so the score does not depend on the world size.
  torch::Tensor per_item =
      torch::zeros({static_cast<int64_t>(items.size())}, torch::TensorOptions().dtype(torch::kFloat64));
  for (size_t i = comm_.rank(); i < items.size(); i += comm_.size()) {
    const int64_t id = static_cast<int64_t>(items[i]);
    const torch::Tensor x0 = clean_points({id}).expand({kEvalLevels, -1, -1});
    std::vector<int64_t> levels;
    for (int64_t k = 0; k < kEvalLevels; ++k)
      levels.push_back((2 * k + 1) * options_.timesteps / (2 * kEvalLevels));
    const torch::Tensor t = torch::tensor(levels, torch::kInt64).to(device_);
    torch::Generator gen = generator(seed_, kEvalPurpose, static_cast<uint64_t>(id), 0);
    const torch::Tensor noise =
        torch::randn({kEvalLevels, options_.tokens, kChannels}, gen, torch::kFloat32).to(device_);
    const torch::Tensor predicted =
        model_->forward(schedule_.add_noise(x0, t, noise), t, /*training=*/false);
    const torch::Tensor squared = (predicted - noise).pow(2);
    per_item[static_cast<int64_t>(i)] =
        ordered_sum(squared) / static_cast<double>(squared.numel());
  }
  per_item = per_item.to(comm_.device());
  comm_.allreduce(per_item, distributed::ReduceOp::Sum);
  per_item = per_item.cpu();
  double sum = 0.0;
  for (int64_t i = 0; i < per_item.size(0); ++i) sum += per_item[i].item<double>();
  EvalScores scores;
  scores.items = static_cast<int64_t>(items.size());
  scores.unit = "shapes";
  if (items.empty()) return scores;
  scores.metrics = {{"denoise_loss", sum / static_cast<double>(items.size())}};
  if (!options_.generative_eval) return scores;
  // As many samples as shapes scored, the same start noise at every eval (comparable across
  // steps); the Chamfer distances on rank 0, which reads the references.
  const torch::Tensor samples =
      draw_samples(static_cast<int64_t>(items.size()), options_.sample_steps,
                   parse_sampler(options_.sampler), seed_, kEvalSamplePurpose, {});
  torch::Tensor values = torch::zeros({3}, torch::TensorOptions().dtype(torch::kFloat64));
  if (comm_.rank() == 0) {
    const std::vector<int64_t> ids(items.begin(), items.end());
    const torch::Tensor references = clean_points(ids).cpu();
    const GenerativeScores g =
        generative_scores(samples.narrow(2, 0, 3), references.narrow(2, 0, 3));
    values = torch::tensor({g.mmd, g.coverage, g.nna}, torch::kFloat64);
  }
  values = values.to(comm_.device());
  comm_.broadcast(values, 0);
  values = values.cpu();
  scores.metrics.emplace_back("mmd", values[0].item<double>());
  scores.metrics.emplace_back("cov", values[1].item<double>());
  scores.metrics.emplace_back("1nna", values[2].item<double>());
  return scores;
}

std::pair<int64_t, int64_t> DiffusionFamily::sample_range(int64_t count) const {
  // Whole chunks of kSampleChunk clouds from the first: each cloud is denoised in the same chunk,
  // with the same shapes, at any world size.
  return chunk_slice(count, kSampleChunk, comm_.rank(), comm_.size());
}

torch::Tensor DiffusionFamily::draw_samples(int64_t count, int64_t steps, Sampler sampler,
                                            uint64_t seed, uint64_t purpose,
                                            const std::function<void(int64_t)>& on_chunk) {
  respaced_levels(steps, options_.timesteps);  // the same UserError on every rank, before work
  const auto [begin, end] = sample_range(count);
  const NoisePredictor predict = [this](const torch::Tensor& x, const torch::Tensor& t) {
    return model_->forward(x, t, /*training=*/false);
  };
  torch::NoGradGuard no_grad;
  const auto threads = bitwise_threads();  // the same clouds at any thread count
  std::vector<torch::Tensor> mine;
  for (int64_t lo = begin; lo < end; lo += kSampleChunk) {
    const int64_t hi = std::min(end, lo + kSampleChunk);
    std::vector<torch::Generator> generators;
    std::vector<torch::Tensor> noise;
    for (int64_t i = lo; i < hi; ++i) {
      generators.push_back(generator(seed, purpose, static_cast<uint64_t>(i), 0));
      noise.push_back(torch::randn({options_.tokens, kChannels}, generators.back(), torch::kFloat32));
    }
    mine.push_back(
        sample(predict, schedule_, torch::stack(noise).to(device_), steps, sampler, generators)
            .cpu());
    if (on_chunk) on_chunk(hi - begin);
  }
  const torch::Tensor local =
      mine.empty() ? torch::empty({0, options_.tokens, kChannels}) : torch::cat(mine);
  return comm_.allgatherv(local.to(comm_.device())).cpu();
}

std::string DiffusionFamily::write_samples(const SampleRequest& request) {
  const int64_t steps = request.steps > 0 ? request.steps : options_.sample_steps;
  const std::string name = request.sampler.empty() ? options_.sampler : request.sampler;
  const Sampler sampler = parse_sampler(name);
  if (request.count < 1) throw UserError("--count must be at least 1");
  const auto start = std::chrono::steady_clock::now();
  const auto [first, last] = sample_range(request.count);
  const int64_t mine = last - first;
  const torch::Tensor clouds =
      draw_samples(request.count, steps, sampler, request.seed, kSamplePurpose,
                   [&](int64_t done) {
                     if (comm_.rank() == 0)
                       std::fprintf(stderr, "\rsampled %lld/%lld on rank 0",
                                    static_cast<long long>(done), static_cast<long long>(mine));
                   });
  if (comm_.rank() == 0 && mine > 0) std::fprintf(stderr, "\n");
  if (comm_.rank() == 0) {
    namespace fs = std::filesystem;
    for (int64_t i = 0; i < clouds.size(0); ++i) {
      char file[32];
      std::snprintf(file, sizeof file, "sample-%04lld.ply", static_cast<long long>(i));
      const fs::path path = fs::path(request.out_dir) / file;
      const fs::path partial = path.string() + ".partial";
      const torch::Tensor rgb = ((clouds[i].narrow(1, 3, 3) + 1) * 127.5).round().clamp(0, 255);
      data::write_ply_points(partial.string(), clouds[i].narrow(1, 0, 3), rgb);
      fs::rename(partial, path);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char line[256];
  std::snprintf(line, sizeof line,
                "%lld samples (%s, %lld steps, %lld points each) in %s/sample-*.ply, %.1f s",
                static_cast<long long>(request.count), name.c_str(),
                static_cast<long long>(steps), static_cast<long long>(options_.tokens),
                request.out_dir.c_str(), seconds);
  return line;
}

void DiffusionFamily::save_state(SnapshotWriter& writer) {
  write_adam_params(writer, model_->named_parameters(), optimizer());
  writer.write_replicated(snapshot_state("lr"),
                          torch::tensor(lr_.at(writer.meta().step), torch::kFloat64));
}

void DiffusionFamily::load_state(const SnapshotReader& reader) {
  read_adam_params(reader, model_->named_parameters(), optimizer(), "the [diffusion] keys");
}

std::string DiffusionFamily::describe() {
  return std::to_string(model_->parameter_count()) + " parameters";
}

std::string DiffusionFamily::not_learning_causes() const {
  return "(1) learning rate: diffusion.lr too high (loss stuck near 1) or too low, or a warm-up "
         "longer than the run (diffusion.warmup_steps); (2) too few tokens or too small a model "
         "for the shapes (diffusion.tokens, width, depth). See docs/diffusion.md.";
}

void register_diffusion_family(FamilyRegistry& registry) {
  FamilyInfo info;
  info.name = kModelName;
  info.create = [](const FamilyContext& c) { return std::make_unique<DiffusionFamily>(c); };
  info.check_config = [](const Config& config) {
    const DiffusionConfig& o = config.section<DiffusionConfig>();
    check_diffusion_options(o, config.source_path);
    if (parse_recompute_policy(config.checkpoint.policy) == RecomputePolicy::Budget) {
      CheckpointPolicyOptions budget;
      budget.budget_mib = config.checkpoint.budget_mib;
      make_checkpoint_policy("budget", budget);  // checkpoint.budget_mib > 0
    }
    LrSchedule{lr_schedule_options(o, config.train.steps)};
  };
  info.open_dataset = [](const std::string& path) -> std::unique_ptr<data::Dataset> {
    return std::make_unique<data::shapes::ShapesReader>(path);
  };
  info.config_sections = {diffusion_config_section()};
  info.shared_keys = diffusion_shared_keys();
  info.key_choices = {{"checkpoint.policy", recompute_policy_names()}};
  registry.add(std::move(info));
}

}  // namespace tessera::models::diffusion
