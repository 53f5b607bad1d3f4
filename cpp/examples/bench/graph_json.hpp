// distgemm_bench --graph-json: every device's captured CUDA graph (nodes with their kind and
// role, edges) beside the plan ops they come from, as one JSON file for the graph tests.
#pragma once

#include <string>

#include "harness.hpp"

namespace distgemm::bench {

// Writes the graphs of every device of `s` to `path`; throws std::runtime_error when the file
// cannot be written.
void write_graph_json(const std::string& path, const Setup& s);

}  // namespace distgemm::bench
