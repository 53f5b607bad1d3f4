# Writes distgemm_bench's llama_shapes.inc (the data that llama_shapes.hpp declares) from
# python/distgemm/data/llama3.json, the one source of the Llama-3 sweep, so that the C++ and the
# Python sweeps run the same cases. Each layer's n and k (+ and * over a model's fields) are
# evaluated here: the .inc holds names and numbers only. Included by cpp/cuda.cmake, or run alone
# (the CPU tests check what it writes against the JSON):
#   cmake -DLLAMA3_JSON=<json> -DLLAMA_SHAPES_INC=<out> -P cpp/examples/bench/llama_shapes.cmake
function(distgemm_llama_shapes json out)
  file(READ "${json}" doc)
  string(JSON models GET "${doc}" models)
  string(JSON layers GET "${doc}" layers)
  string(JSON last_model LENGTH "${models}")
  string(JSON last_layer LENGTH "${layers}")
  math(EXPR last_model "${last_model} - 1")
  math(EXPR last_layer "${last_layer} - 1")
  set(model_rows "")
  set(layer_rows "")
  set(gemm_rows "")
  foreach(l RANGE ${last_layer})
    string(JSON name GET "${layers}" ${l} name)
    string(JSON collective GET "${layers}" ${l} collective)
    string(JSON schedule GET "${layers}" ${l} schedule)
    string(APPEND layer_rows "    {\"${name}\", \"${collective}\", \"${schedule}\"},\n")
  endforeach()
  foreach(m RANGE ${last_model})
    string(JSON model GET "${models}" ${m} name)
    string(APPEND model_rows "    {\"${model}\"},\n")
    foreach(l RANGE ${last_layer})
      string(JSON layer GET "${layers}" ${l} name)
      foreach(dim n k)
        # Every name of the expression replaced by the model's field, then the arithmetic.
        string(JSON expr GET "${layers}" ${l} ${dim})
        string(REGEX MATCHALL "[A-Za-z_][A-Za-z0-9_]*|[^A-Za-z_]+" parts "${expr}")
        set(arithmetic "")
        foreach(part IN LISTS parts)
          if(part MATCHES "^[A-Za-z_]")
            string(JSON part GET "${models}" ${m} ${part})
          endif()
          string(APPEND arithmetic "${part}")
        endforeach()
        math(EXPR ${dim} "${arithmetic}")
      endforeach()
      string(APPEND gemm_rows "    {\"${model}\", \"${layer}\", ${n}, ${k}},\n")
    endforeach()
  endforeach()
  string(JSON tokens GET "${doc}" tokens)
  string(JSON quick_models GET "${doc}" quick models)
  string(JSON quick_tokens GET "${doc}" quick tokens)
  foreach(list tokens quick_tokens quick_models)  # JSON arrays as C++ initializer lists
    string(REGEX REPLACE "[][ ]" "" ${list} "${${list}}")
    string(REPLACE "," ", " ${list} "${${list}}")
  endforeach()
  set(timing "")
  foreach(field warmup_ms rewarm_ms timed_ms min_iterations max_iterations)
    string(JSON value GET "${doc}" timing ${field})
    string(APPEND timing "${value}, ")
  endforeach()
  string(REGEX REPLACE ", $" "" timing "${timing}")
  file(CONFIGURE OUTPUT "${out}" CONTENT "// Generated from ${json} by \
cpp/examples/bench/llama_shapes.cmake: edit the JSON, not this file.
inline constexpr Model kModels[] = {
${model_rows}};
inline constexpr Layer kLayers[] = {
${layer_rows}};
inline constexpr LayerGemm kLayerGemms[] = {
${gemm_rows}};
inline constexpr int64_t kTokens[] = {${tokens}};
inline constexpr const char* kQuickModels[] = {${quick_models}};
inline constexpr int64_t kQuickTokens[] = {${quick_tokens}};
inline constexpr SweepTiming kSweepTiming{${timing}};
")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  distgemm_llama_shapes("${LLAMA3_JSON}" "${LLAMA_SHAPES_INC}")
endif()
