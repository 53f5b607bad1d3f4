// Llama-3 tensor-parallel layer shapes: the one definition of what the Llama sweeps measure.
//
// Read by `distgemm_bench --sweep` (cpp/examples/) and, through distgemm._core.llama_*, by the
// Python sweep benchmarks/llama_sweep.py, so the single-process C++ numbers and the torchrun
// numbers are taken on the same shapes. Host-only (no CUDA, no schedule headers): g++ alone.
//
// Every layer is one GEMM D[M, N] = X[M, K] @ W[N, K]^T (W in nn.Linear layout), M = tokens:
//   QKV  N = (q_heads + 2 * kv_heads) * head_dim, K = hidden    column parallel: all-gather X
//   O    N = hidden, K = q_heads * head_dim                      row parallel: reduce-scatter D
//   FC1  N = 2 * ffn (gate and up in one weight), K = hidden     column parallel: all-gather X
//   FC2  N = hidden, K = ffn                                     row parallel: reduce-scatter D
// Sequence parallelism on both sides: the activations X (all-gather) and the output D
// (reduce-scatter) are sharded on M across the TP ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace distgemm::llama {

struct Model {
  const char* name;
  int64_t hidden, ffn, q_heads, kv_heads, head_dim;
};

// Llama-3 / 3.1 configs (config.json: hidden_size, intermediate_size, num_attention_heads,
// num_key_value_heads, hidden_size / num_attention_heads).
inline constexpr Model kModels[] = {
    {"8B", 4096, 14336, 32, 8, 128},
    {"70B", 8192, 28672, 64, 8, 128},
    {"405B", 16384, 53248, 128, 8, 128},
};

struct Layer {
  const char* name;
  const char* collective;  // "all_gather" or "reduce_scatter" (distgemm collective names)
  const char* schedule;    // the default distgemm schedule for it (a name in schedules/all.hpp)
};

// Both all-gather layers rotate the activation shard (A) around the ring and keep the weight
// shard local; both reduce-scatter layers pass the partial output tiles of M.
inline constexpr Layer kLayers[] = {
    {"QKV", "all_gather", "ag_rotate_a"},
    {"O", "reduce_scatter", "rs_tile_a"},
    {"FC1", "all_gather", "ag_rotate_a"},
    {"FC2", "reduce_scatter", "rs_tile_a"},
};

// Tokens per batch (M) of the full sweep; the quick sweep is 70B at 4096 and 8192 tokens.
inline constexpr int64_t kTokens[] = {1024, 2048, 4096, 8192, 16384};
inline constexpr const char* kQuickModels[] = {"70B"};
inline constexpr int64_t kQuickTokens[] = {4096, 8192};

struct Gemm {
  int64_t m = 0, n = 0, k = 0;
};

// How the sweeps time one variant of a case, at the steady state of power-capped GPUs (a short
// burst, or a window right after lighter work, runs faster than the same kernel under sustained
// load): at least warmup_ms of sustained replays before a case's first timing, rewarm_ms of the
// variant's own replays before each further one, then one window of about timed_ms with an
// event pair per replay, within [min_iterations, max_iterations]; the median is reported.
// docs/tuning.md has the measurements behind the windows.
struct SweepTiming {
  int warmup_ms = 1000;
  int rewarm_ms = 250;
  int timed_ms = 1000;
  int min_iterations = 10, max_iterations = 20000;
};
inline constexpr SweepTiming kSweepTiming{};

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
  const std::string n = l.name;
  if (n == "QKV") return {tokens, (c.q_heads + 2 * c.kv_heads) * c.head_dim, c.hidden};
  if (n == "O") return {tokens, c.hidden, c.q_heads * c.head_dim};
  if (n == "FC1") return {tokens, 2 * c.ffn, c.hidden};
  if (n == "FC2") return {tokens, c.hidden, c.ffn};
  throw std::logic_error("internal: kLayers has layer '" + n + "' without a GEMM shape");
}
inline Gemm global_gemm(const std::string& model, const std::string& layer, int64_t tokens) {
  return global_gemm(find_model(model), find_layer(layer), tokens);
}

struct Case {
  const Model* model;
  const Layer* layer;
  int64_t tokens;
  Gemm gemm() const { return global_gemm(*model, *layer, tokens); }
  // "70B/FC1/M8192/TP2", the case name benchmarks/llama_sweep.py uses.
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
// N of a column-parallel or K of a row-parallel weight), else the reason with the values.
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
