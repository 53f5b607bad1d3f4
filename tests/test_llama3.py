"""The one source of the Llama-3 sweep (python/distgemm/data/llama3.json): distgemm_bench's data,
as cpp/examples/bench/llama_shapes.cmake writes it and llama_shapes.hpp reads it (host-only,
compiled with g++ here), gives the same cases, GEMMs, TP splits and timing as distgemm.llama3;
and the rules of distgemm.llama3 that the sweeps' tests do not reach."""

import pathlib
import shutil
import subprocess

import pytest

from distgemm import llama3

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Prints every case of both sweeps with its GEMM and the split verdict at TP 1..8, then the
# timing, one line each, in the format python_lines() writes.
PROGRAM = r"""
#include <cstdio>
#include "llama_shapes.hpp"
namespace L = distgemm::llama;
int main() {
  for (bool quick : {false, true})
    for (const L::Case& c : L::cases(quick)) {
      const L::Gemm g = c.gemm();
      std::printf("%d %s %s %lld %lld %lld %lld\n", int(quick), c.model->name, c.layer->name,
                  (long long)c.tokens, (long long)g.m, (long long)g.n, (long long)g.k);
      for (int tp = 0; tp <= 8; ++tp) std::printf("%s|%d|%s\n", c.name(tp).c_str(), tp,
                                                  L::tp_split_reason(c, tp).c_str());
    }
  for (const L::Layer& l : L::kLayers) std::printf("%s %s %s\n", l.name, l.collective, l.schedule);
  const L::SweepTiming& t = L::kSweepTiming;
  std::printf("%d %d %d %d %d\n", t.warmup_ms, t.rewarm_ms, t.timed_ms, t.min_iterations,
              t.max_iterations);
}
"""


def python_lines() -> list[str]:
    out = []
    for quick in (False, True):
        for model, layer, tokens in llama3.cases(quick):
            m, n, k = llama3.gemm(model, layer, tokens)
            out.append(f"{int(quick)} {model} {layer} {tokens} {m} {n} {k}")
            for tp in range(9):
                why = llama3.tp_split_reason(model, layer, tokens, tp)
                out.append(f"{model}/{layer}/M{tokens}/TP{tp}|{tp}|{why}")
    out += [f"{name} {d['collective']} {d['schedule']}" for name, d in llama3.layers().items()]
    t = llama3.sweep_timing()
    keys = ("warmup_ms", "rewarm_ms", "timed_ms", "min_iterations", "max_iterations")
    out.append(" ".join(str(t[key]) for key in keys))
    return out


def test_bench_header_holds_the_json(tmp_path):
    cmake, cxx = shutil.which("cmake"), shutil.which("g++") or shutil.which("c++")
    assert cmake and cxx, "cmake and a host C++ compiler (g++) are required"
    inc = tmp_path / "llama_shapes.inc"
    gen = subprocess.run(
        [
            cmake,
            f"-DLLAMA3_JSON={ROOT / 'python/distgemm/data/llama3.json'}",
            f"-DLLAMA_SHAPES_INC={inc}",
            "-P",
            str(ROOT / "cpp/examples/bench/llama_shapes.cmake"),
        ],
        capture_output=True,
        text=True,
    )
    assert gen.returncode == 0, gen.stderr
    src, exe = tmp_path / "print.cpp", tmp_path / "print"
    src.write_text(PROGRAM)
    flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror"]
    includes = [f"-I{tmp_path}", f"-I{ROOT / 'cpp/examples/bench'}"]
    build = subprocess.run(
        [cxx, *flags, *includes, str(src), "-o", str(exe)], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == python_lines()


@pytest.mark.parametrize(
    "model,layer,tokens,tp,why",
    [
        ("70B", "QKV", 1024, 3, "M=1024 is not divisible by TP=3 (sequence-parallel activations)"),
        ("8B", "FC1", 3, 3, "N=28672 is not divisible by TP=3 (column-parallel weight)"),
        ("8B", "O", 3, 3, "K=4096 is not divisible by TP=3 (row-parallel weight)"),
        ("405B", "FC2", 1024, 0, "TP=0: needs at least one rank"),
        ("405B", "FC2", 1024, 8, ""),
    ],
)
def test_tp_split_reason(model, layer, tokens, tp, why):
    assert llama3.tp_split_reason(model, layer, tokens, tp) == why


@pytest.mark.parametrize("expr", ["hidden / 2", "hidden - 1", "ffn ** 2", "heads", "2.5 * ffn"])
def test_a_layer_dimension_is_sums_and_products_of_fields(expr):
    fields = llama3.models()["8B"]
    with pytest.raises(ValueError, match="is not \\+ and \\* over integers and hidden"):
        llama3._evaluate(expr, fields)


def test_layer_nk_of_any_model_config():
    """The JSON's formulas serve models outside its list (the decode and serving benchmarks'
    non-Llama shapes); for its own models they give what gemm() does."""
    for model, fields in llama3.models().items():
        for layer in llama3.layers():
            assert llama3.layer_nk(fields, layer) == llama3.gemm(model, layer, 1)[1:]
    qwen2_72b = dict(hidden=8192, ffn=29568, q_heads=64, kv_heads=8, head_dim=128)
    assert llama3.layer_nk(qwen2_72b, "FC2") == (8192, 29568)
    assert llama3.layer_nk(qwen2_72b, "QKV") == (10240, 8192)
    with pytest.raises(ValueError, match="unknown Llama layer 'MLP'; valid layers: QKV, O"):
        llama3.layer_nk(qwen2_72b, "MLP")
