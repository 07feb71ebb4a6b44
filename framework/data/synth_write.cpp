// Writes a `tessera synth` scene as a tessera-scene dataset: builds the preset, renders every view
// and samples surface points, streaming them into a SceneWriter (atomic rename on commit).
#include <chrono>
#include <filesystem>

#include "framework/data/import.h"
#include "framework/data/synth.h"

namespace tessera::data::synth {

SynthSummary write_synth_scene(const SynthOptions& options, const std::string& path,
                               const SynthProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const SynthScene scene = build_scene(options);
  SynthSummary summary;
  for (const Camera& camera : scene.cameras)
    ++summary.views_per_split[static_cast<size_t>(camera.split)];

  // The views are rendered in the scene's own units; a capture-like preset's cameras, points and
  // boxes are written normalized, as `tessera convert` writes an imported photo capture.
  SurfacePoints points = sample_surface_points(scene, kSurfacePoints);
  SceneMeta meta = scene.meta;
  std::vector<Camera> cameras = scene.cameras;
  if (scene.as_capture) {
    const Normalization n = normalization_for(cameras, points.xyz, std::nullopt,
                                              /*bounded=*/false, /*normalize=*/true);
    apply_normalization(n, cameras, points.xyz);
    record_normalization(n, meta);
  }
  SceneWriter writer(path, meta, cameras, scene.with_alpha);
  writer.write_points(points.xyz, points.rgb);
  summary.points = points.xyz.size(0);
  for (size_t i = 0; i < scene.cameras.size(); ++i) {
    const RenderedView view = render_view(scene, i);
    writer.write_image(i, view.rgb, view.alpha);
    if (progress) progress(i + 1, scene.cameras.size());
  }
  writer.commit();

  std::error_code ignored;
  summary.file_bytes = std::filesystem::file_size(path, ignored);
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace tessera::data::synth
