// The schedule registry: every definition in this folder, by name. Adding a schedule means
// adding its file, one line here, and its tests (tests/test_simulator.py picks it up by name).
#pragma once
#include <cstring>
#include <stdexcept>
#include <string>

#include "ag_rotate_a.hpp"
#include "ag_rotate_b.hpp"
#include "ar_tile_a.hpp"
#include "rs_tile_a.hpp"
#include "rs_tile_b.hpp"

namespace distgemm::schedules {
inline constexpr const ScheduleDef* kAll[] = {&ag_rotate_a, &ag_rotate_b, &rs_tile_a, &rs_tile_b,
                                              &ar_tile_a};
inline const ScheduleDef* find(const char* name) {
  for (const ScheduleDef* s : kAll)
    if (std::strcmp(s->name, name) == 0) return s;
  return nullptr;
}
// The definition named `name`, or std::invalid_argument listing the known schedules.
inline const ScheduleDef& find_or_throw(const std::string& name) {
  if (const ScheduleDef* s = find(name.c_str())) return *s;
  std::string known;
  for (const ScheduleDef* s : kAll) known += (known.empty() ? "" : ", ") + std::string(s->name);
  throw std::invalid_argument("unknown schedule '" + name + "'; known schedules: " + known);
}
}  // namespace distgemm::schedules
