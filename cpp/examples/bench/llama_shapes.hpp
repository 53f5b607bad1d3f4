// Llama-3 tensor-parallel layer cases of `distgemm_bench --sweep`: the types and lookups over the
// data in llama_shapes.inc, which CMake writes from python/distgemm/data/llama3.json
// (llama_shapes.cmake), the one definition of what the Llama sweeps measure: the Python sweeps
// read the same file (distgemm.llama3), so the single-process C++ numbers and the torchrun
// numbers are taken on the same shapes. Host-only (no CUDA, no schedule headers): g++ alone.
//
// Every layer is one GEMM D[M, N] = X[M, K] @ W[N, K]^T (W in nn.Linear layout), M = tokens, N
// and K from the model's config (the JSON says how). The all-gather layers (QKV, FC1) are column
// parallel: all-gather X; the reduce-scatter layers (O, FC2) row parallel: reduce-scatter D.
// Sequence parallelism on both sides: the activations X (all-gather) and the output D
// (reduce-scatter) are sharded on M across the TP ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace distgemm::llama {

struct Model {
  const char* name;
};

struct Layer {
  const char* name;
  const char* collective;  // "all_gather" or "reduce_scatter" (distgemm collective names)
  const char* schedule;    // the default distgemm schedule for it (a name in schedules/all.hpp)
};

// N and K of one model's layer.
struct LayerGemm {
  const char* model;
  const char* layer;
  int64_t n, k;
};

// How the sweeps time one variant of a case, at the steady state of power-capped GPUs: at least
// warmup_ms of sustained replays before a case's first timing, rewarm_ms of the variant's own
// replays before each further one, then one window of about timed_ms with an event pair per
// replay, within [min_iterations, max_iterations]; the median is reported (docs/tuning.md says
// why).
struct SweepTiming {
  int warmup_ms, rewarm_ms, timed_ms, min_iterations, max_iterations;
};

// kModels, kLayers (sweep order), kLayerGemms, kTokens (the full sweep), kQuickModels and
// kQuickTokens (the quick sweep), kSweepTiming.
#include "llama_shapes.inc"

struct Gemm {
  int64_t m = 0, n = 0, k = 0;
};

namespace detail {
template <class T, size_t N>
std::string join_names(const T (&v)[N]) {
  std::string s;
  for (const T& x : v) s += (s.empty() ? "" : ", ") + std::string(x.name);
  return s;
}
}  // namespace detail

// The model / layer named `name`, or std::invalid_argument naming the valid ones.
inline const Model& find_model(const std::string& name) {
  for (const Model& m : kModels)
    if (name == m.name) return m;
  throw std::invalid_argument("unknown Llama model '" + name +
                              "'; valid models: " + detail::join_names(kModels));
}
inline const Layer& find_layer(const std::string& name) {
  for (const Layer& l : kLayers)
    if (name == l.name) return l;
  throw std::invalid_argument("unknown Llama layer '" + name +
                              "'; valid layers: " + detail::join_names(kLayers));
}

// Global (M, N, K) of one layer at `tokens` tokens.
inline Gemm global_gemm(const Model& c, const Layer& l, int64_t tokens) {
  if (tokens < 1)
    throw std::invalid_argument("tokens=" + std::to_string(tokens) + " must be positive");
  for (const LayerGemm& g : kLayerGemms)
    if (std::strcmp(g.model, c.name) == 0 && std::strcmp(g.layer, l.name) == 0)
      return {tokens, g.n, g.k};
  throw std::logic_error("internal: llama_shapes.inc has no GEMM of " + std::string(c.name) + "/" +
                         l.name);
}
inline Gemm global_gemm(const std::string& model, const std::string& layer, int64_t tokens) {
  return global_gemm(find_model(model), find_layer(layer), tokens);
}

struct Case {
  const Model* model;
  const Layer* layer;
  int64_t tokens;
  Gemm gemm() const { return global_gemm(*model, *layer, tokens); }
  // "70B/FC1/M8192/TP2", the case name benchmarks/sweep/llama_sweep.py uses.
  std::string name(int tp) const {
    return std::string(model->name) + "/" + layer->name + "/M" + std::to_string(tokens) + "/TP" +
           std::to_string(tp);
  }
};

// The models and the token counts of the full or the quick sweep, in sweep order.
inline std::vector<const Model*> models(bool quick) {
  std::vector<const Model*> out;
  if (quick)
    for (const char* n : kQuickModels) out.push_back(&find_model(n));
  else
    for (const Model& mo : kModels) out.push_back(&mo);
  return out;
}

inline std::vector<int64_t> tokens(bool quick) {
  return quick ? std::vector<int64_t>(std::begin(kQuickTokens), std::end(kQuickTokens))
               : std::vector<int64_t>(std::begin(kTokens), std::end(kTokens));
}

// Every case of the full or quick sweep, in the order the sweeps run them: model, then tokens,
// then layer (the four layers of one forward pass at one size side by side).
inline std::vector<Case> cases(bool quick) {
  std::vector<Case> out;
  for (const Model* mo : models(quick))
    for (int64_t t : tokens(quick))
      for (const Layer& la : kLayers) out.push_back({mo, &la, t});
  return out;
}

// "" when TP ranks can split the layer exactly (M for the sequence-parallel activations / output,
// N of a column-parallel or K of a row-parallel weight), else the reason with the values. The
// same rule as distgemm.llama3.tp_split_reason.
inline std::string tp_split_reason(const Case& c, int tp) {
  const Gemm g = c.gemm();
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (tp < 1) return "TP=" + s(tp) + ": needs at least one rank";
  if (g.m % tp)
    return "M=" + s(g.m) + " is not divisible by TP=" + s(tp) + " (sequence-parallel activations)";
  const bool ag = std::string(c.layer->collective) == "all_gather";
  if (ag && g.n % tp)
    return "N=" + s(g.n) + " is not divisible by TP=" + s(tp) + " (column-parallel weight)";
  if (!ag && g.k % tp)
    return "K=" + s(g.k) + " is not divisible by TP=" + s(tp) + " (row-parallel weight)";
  return "";
}

}  // namespace distgemm::llama
