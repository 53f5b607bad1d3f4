// The order in which the data-parallel GEMM kernels visit their output tiles, shared by the
// device scheduler (exact_swizzle_scheduler.cuh) and the host model (tile_choice.hpp), so that the
// model counts the tiles the kernel runs.
//
// Tiles are visited in clusters (CUTLASS's cluster shape: the CTAs that multicast a shared
// operand tile). The cluster grid has `minor` clusters along the minor mode (M when the raster
// runs along N) and `major` along the other. Clusters are numbered in groups of `group` (the
// swizzle) along the minor mode: a group's clusters go minor-first, then step along the major
// mode, so that neighbouring CTAs share both operands. Where `group` does not divide `minor`, the
// last group is narrower. CUTLASS's own scheduler instead pads the grid to a multiple of the
// swizzle in both modes and runs the padding tiles through the whole mainloop.
#pragma once

#include <cstdint>

#include "distgemm/host_device.hpp"

namespace distgemm::kernel {

struct TileWalk {
  uint32_t minor = 1;  // clusters along the minor mode
  uint32_t major = 1;  // clusters along the major mode
  uint32_t group = 1;  // clusters per group along the minor mode (the swizzle), >= 1
};

struct WalkCoord {
  uint32_t minor = 0;
  uint32_t major = 0;
};

// The cluster that visit `index` (0 .. minor x major - 1) runs.
DISTGEMM_HD inline WalkCoord walk_cluster(uint32_t index, TileWalk w) {
  const uint32_t band = w.group * w.major;  // clusters of one full group
  const uint32_t g = index / band;
  const uint32_t within = index - g * band;
  const uint32_t first = g * w.group;
  const uint32_t width = w.minor - first < w.group ? w.minor - first : w.group;
  return WalkCoord{first + within % width, within / width};
}

}  // namespace distgemm::kernel
