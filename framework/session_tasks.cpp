// `tessera eval` and `tessera render` on a restored run (session_tasks.h).
#include "framework/session_tasks.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/camera_path.h"
#include "framework/data/image_io.h"
#include "framework/data/orbit.h"
#include "framework/data/video.h"
#include "framework/learning_check.h"

namespace tessera {

nlohmann::json evaluate_splits(const Session& run, const std::string& split, int64_t max_views) {
  const std::vector<std::string> splits =
      split.empty() ? std::vector<std::string>{"val", "test"} : std::vector<std::string>{split};
  nlohmann::json result;
  result["model"] = run.config.model.name;
  result["ranks"] = run.comm->size();
  if (ViewRenderer* renderer = run.family->view_renderer()) result["layout"] = renderer->render_layout();
  for (const std::string& name : splits) {
    const std::vector<size_t> views = run.dataset->indices(data::parse_split(name, "--split"));
    if (views.empty() && split.empty()) continue;  // the dataset has no such split
    if (views.empty()) throw UserError(run.config.data.path + " has no " + name + " split");
    run.run->set_eval_views(name, max_views);
    result["splits"][name] = run.run->evaluate(run.step, /*write=*/false).to_json();
  }
  if (!result.contains("splits"))
    throw UserError(run.config.data.path + " has neither a val nor a test split; use --split train");
  return result;
}

int64_t render_views(const Session& run, const RenderRequest& request) {
  const data::SceneReader* scene = run.dataset->as_scene();
  ViewRenderer* renderer = run.family->view_renderer();
  if (!scene || !renderer)
    throw UserError(run.config.data.path + ": model '" + run.config.model.name + "' trains on " +
                    run.dataset->summary() + ", not on camera views: there is nothing to render " +
                    "(`tessera eval` scores it)");
  std::vector<std::pair<std::string, data::Camera>> views;
  double fps = request.fps;
  if (!request.camera_path.empty()) {
    const data::CameraPath path =
        data::read_camera_path(request.camera_path, scene->meta(), request.dataparser_transforms);
    for (size_t i = 0; i < path.cameras.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "path-%03zu", i);
      views.emplace_back(name, path.cameras[i]);
    }
    if (fps <= 0) fps = path.fps;
  } else if (request.orbit > 0) {
    const std::vector<data::Camera> cameras = data::orbit_cameras(*scene, request.orbit);
    for (size_t i = 0; i < cameras.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "orbit-%03zu", i);
      views.emplace_back(name, cameras[i]);
    }
  } else {
    const std::string split = request.split.empty() ? "test" : request.split;
    for (size_t index : scene->indices(data::parse_split(split, "--split"))) {
      char name[48];
      std::snprintf(name, sizeof name, "%s-%03zu", split.c_str(), index);
      views.emplace_back(name, scene->cameras()[index]);
    }
    if (views.empty())
      throw UserError(run.config.data.path + " has no " + split + " views; use --split or --orbit");
  }
  // Spread over the views, as an eval picks them (an orbit or a path keeps its whole span).
  if (request.max_views >= 0) views = spread_views(views, request.max_views);
  if (!request.video.empty()) {
    // Checked on every rank, before any rendering: a video's frames share one size.
    for (const auto& [name, camera] : views)
      if (camera.width != views.front().second.width || camera.height != views.front().second.height)
        throw UserError("--video: the views differ in size (" + views.front().first + " is " +
                        std::to_string(views.front().second.width) + "x" +
                        std::to_string(views.front().second.height) + ", " + name + " " +
                        std::to_string(camera.width) + "x" + std::to_string(camera.height) +
                        "); render an --orbit, or PNGs with --out only");
  }
  const bool root = run.comm->rank() == 0;
  const std::string layout = renderer->render_layout();
  if (root) std::cerr << "rendering " << views.size() << " views: " << layout << "\n";
  if (root && !request.out.empty()) std::filesystem::create_directories(request.out);
  if (fps <= 0) fps = 30;
  std::unique_ptr<data::VideoWriter> video;
  const bool geometry = request.depth || request.alpha;
  // Depth in the capture's units: world = capture_scale * capture + offset (docs/datasets.md).
  const double capture_scale = scene->meta().capture_scale;
  for (size_t i = 0; i < views.size(); ++i) {
    ViewOutputs outputs;
    if (geometry) outputs = renderer->render_outputs(views[i].second, run.step);
    else outputs.rgb = renderer->render_camera(views[i].second, run.step);
    const torch::Tensor& image = outputs.rgb;
    if (!root) continue;
    const std::string stem = (std::filesystem::path(request.out) / views[i].first).string();
    if (!request.out.empty() && request.rgb) data::write_png_unit(stem + ".png", image);
    if (request.depth) {
      const torch::Tensor depth = outputs.depth / capture_scale;
      const double largest = depth.max().item<double>();
      data::write_npy(stem + ".depth.npy", depth);
      char text[32];
      std::snprintf(text, sizeof text, "%.9g", largest);
      data::write_png16(stem + ".depth.png", depth, largest,
                        {{"depth_max", text}, {"Comment", "expected depth along the optical "
                          "axis in the capture's units: value / 65535 * depth_max"}});
    }
    if (request.alpha) {
      data::write_npy(stem + ".alpha.npy", outputs.alpha);
      data::write_png16(stem + ".alpha.png", outputs.alpha, 1.0,
                        {{"Comment", "accumulated opacity: value / 65535"}});
    }
    if (!request.video.empty()) {
      if (!video)
        video = std::make_unique<data::VideoWriter>(request.video, image.size(1), image.size(0),
                                                    fps);
      video->add_frame(image);
    }
    std::cerr << "\rrendered " << (i + 1) << "/" << views.size() << std::flush;
  }
  if (root) {
    std::cerr << "\n";
    if (!request.out.empty()) {
      std::string what;
      for (const auto& [on, name] : {std::pair{request.rgb, "rgb"}, std::pair{request.depth, "depth"},
                                     std::pair{request.alpha, "alpha"}})
        if (on) what += (what.empty() ? "" : ", ") + std::string(name);
      std::cerr << views.size() << " views in " << request.out << " (" << what << ")\n";
    }
    if (video) {
      video->finish();
      std::cerr << "video " << request.video << ": " << video->frames() << " frames at "
                << fps << " fps\n";
    }
  }
  return static_cast<int64_t>(views.size());
}

}  // namespace tessera
