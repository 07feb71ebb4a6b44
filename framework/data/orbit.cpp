// Camera paths around a scene (orbit.h).
#include "framework/data/orbit.h"

#include <cmath>

#include "framework/data/synth.h"

namespace tessera::data {

std::vector<Camera> orbit_cameras(const SceneReader& scene, int n) {
  const auto& b = scene.meta().scene_bounds;
  const synth::Vec3 center{(b[0] + b[3]) / 2, (b[1] + b[4]) / 2, (b[2] + b[5]) / 2};
  double radius = 0, height = 0;
  for (const Camera& c : scene.cameras()) {
    const double dx = c.camera_to_world[3] - center.x, dy = c.camera_to_world[7] - center.y;
    radius += std::sqrt(dx * dx + dy * dy);
    height += c.camera_to_world[11];
  }
  radius /= scene.cameras().size();
  height /= scene.cameras().size();
  std::vector<Camera> cameras;
  for (int i = 0; i < n; ++i) {
    const double a = 2.0 * M_PI * i / n;
    Camera c = scene.cameras().front();
    c.k1 = c.k2 = c.p1 = c.p2 = 0;
    c.camera_to_world =
        synth::look_at({center.x + radius * std::cos(a), center.y + radius * std::sin(a), height},
                       center);
    cameras.push_back(c);
  }
  return cameras;
}

}  // namespace tessera::data
