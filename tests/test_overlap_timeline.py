"""CPU tests of the pure parts of the overlap timeline: chrome-trace parsing, event
classification, alignment, overlap, summary (benchmarks/timeline/events.py), lanes, JSON round
trip, plotting and --replot (benchmarks/timeline/report.py,
benchmarks/timeline/overlap_timeline.py). The torch.distributed / CUDA part (run_layer, main) is
not called here."""

import json
import subprocess
import sys

import pytest

from benchmarks.common.llama_cases import Case
from benchmarks.timeline import events as ev
from benchmarks.timeline import report as rep

try:
    import matplotlib  # noqa: F401

    HAVE_MPL = True
except Exception:  # noqa: BLE001
    HAVE_MPL = False
NEEDS_MPL = pytest.mark.skipif(
    not HAVE_MPL,
    reason="matplotlib is not installed here: the PNG "
    "is optional (the JSON is always written; --replot renders later)",
)

CUTLASS = (
    "void distgemm::kernel::waiting_gemm_kernel<cutlass::gemm::kernel::GemmUniversal<cute::"
    "tuple<int, int, int, int>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
    "MainloopSm90TmaGmmaWarpSpecialized<7, cute::tuple<cute::C<2>, cute::C<1>, cute::C<1>>, "
    "cutlass::gemm::KernelTmaWarpSpecializedCooperative>, cute::tuple<cute::C<256>, cute::C"
    "<128>, cute::C<64>>, cutlass::bfloat16_t>, void>>(cutlass::gemm::kernel::GemmUniversal"
    "<...>::Params, distgemm::kernel::WaitSpec)"
)
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
PTOP = "Memcpy PtoP (Device -> Device)"
DTOD = "Memcpy DtoD (Device -> Device)"
BARRIER = "distgemm::kernel::entry_barrier_kernel(distgemm::kernel::EntryBarrierSpec)"


def X(cat, name, ts, dur, **args):
    """A chrome-trace complete event as torch.profiler writes it (GPU: pid device, tid stream)."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": args.get("device", 4242),
        "tid": args.get("stream", 4242),
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def rank_trace(rank, base_ns=1_790_000_000_000_000_000, t=1000.0, gemm_name=CUTLASS):
    """A distgemm-like window on one rank (all graph nodes on launch stream 7, as CUPTI may report
    them): barrier, GEMM 0 [t+10, t+510] with a 64 MiB peer push [t+20, t+320] and a 4-byte flag
    right after, GEMM 1 [t+515, t+1015]; plus an event before the marker, CPU ops, metadata."""
    d, s = rank, 7
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": base_ns,
        "displayTimeUnit": "ms",
        "traceEvents": [
            {
                "ph": "M",
                "name": "process_name",
                "pid": d,
                "tid": 0,
                "ts": 0.0,
                "args": {"name": "python3"},
            },
            X("kernel", gemm_name, t - 400.0, 300.0, device=d, stream=s),  # re-warm, not windowed
            X("user_annotation", f"{ev.MARKER_PREFIX}FC1:distgemm", t, 1100.0),
            X(
                "gpu_user_annotation",
                f"{ev.MARKER_PREFIX}FC1:distgemm",
                t + 5.0,
                1000.0,
                device=d,
                stream=s,
            ),
            X("cpu_op", "aten::empty", t + 1.0, 2.0),
            X("cuda_runtime", "cudaGraphLaunch", t + 3.0, 5.0, correlation=11),
            X("kernel", BARRIER, t + 5.0, 4.0, device=d, stream=s, correlation=11),
            X("kernel", gemm_name, t + 10.0, 500.0, device=d, stream=s, correlation=11),
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": PTOP,
                "pid": d,
                "tid": f"stream {s}",
                "ts": t + 20.0,
                "dur": 300.0,
                "args": {
                    "fromDevice": d,
                    "inDevice": d,
                    "toDevice": 1 - d,
                    "stream": s,
                    "correlation": 11,
                    "bytes": 64 << 20,
                },
            },
            X("gpu_memcpy", DTOD, t + 321.0, 1.5, device=d, stream=s, bytes=4),
            X("kernel", gemm_name, t + 515.0, 500.0, device=d, stream=s, correlation=11),
        ],
    }


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize(
    "name,kind,nbytes,cls",
    [
        (CUTLASS, "kernel", 0, "gemm"),
        (
            "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(Params)",
            None,
            0,
            "gemm",
        ),
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "kernel", 0, "gemm"),  # cuBLAS on Hopper
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas", "kernel", 0, "gemm"),
        (NCCL_AG, "kernel", 0, "nccl"),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            None,
            0,
            "nccl",
        ),
        (PTOP, "memcpy", 64 << 20, "copy"),
        (PTOP, None, 64 << 20, "copy"),  # kind inferred from the name
        (DTOD, "memcpy", 4, "signal"),  # distgemm's flag write
        (DTOD, "memcpy", 64, "signal"),
        (DTOD, "memcpy", 65, "copy"),
        ("Memset (Device)", "memset", 4096, "signal"),
        (BARRIER, "kernel", 0, "other"),  # 'distgemm' in the name is no GEMM
        ("void distgemm::kernel::copy_wait_kernel(distgemm::kernel::WaitSpec)", None, 0, "other"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            None,
            0,
            "other",
        ),
        ("call 0", "call", 0, "call"),
    ],
)
def test_classify(name, kind, nbytes, cls):
    assert ev.classify(name, kind, nbytes) == cls


def test_kind_of():
    assert ev.kind_of("gpu_memcpy", "x") == "memcpy"
    assert ev.kind_of("GPU_MEMSET", "x") == "memset"
    assert ev.kind_of("kernel", PTOP) == "kernel"  # the category wins
    assert ev.kind_of(None, PTOP) == "memcpy"
    assert ev.kind_of("", "Memset (Device)") == "memset"
    assert ev.kind_of(None, NCCL_AG) == "kernel"


# ------------------------------------------------------------------ intervals and overlap


def test_interval_algebra():
    assert ev.merge([(3, 4), (1, 2), (1.5, 2.5), (5, 5)]) == [(1, 2.5), (3, 4)]
    assert ev.intersect([(1, 3)], [(2, 5)]) == [(2, 3)]
    assert ev.length(ev.intersect([(1, 3)], [(2, 5)])) == 1.0
    assert ev.intersect([(0, 10)], [(1, 2), (3, 4), (9, 12)]) == [(1, 2), (3, 4), (9, 10)]
    assert ev.intersect([(0, 1)], [(1, 2)]) == []  # touching is not overlapping
    assert ev.length([(0, 2), (1, 3), (10, 11)]) == 4.0


def test_copy_overlapping_kernel_two_lanes():
    # a copy on the copy lane [1, 3] ms and a GEMM kernel on the compute lane [2, 5] ms
    evs = [
        ev.GpuEvent(0, 0, 7, 2000.0, 3000.0, CUTLASS, "kernel"),
        ev.GpuEvent(0, 0, 9, 1000.0, 2000.0, PTOP, "memcpy", 1 << 20),
    ]
    labels, lane_of = rep.assign_lanes(evs)
    assert len(labels) == 2 and lane_of[0] != lane_of[1]
    assert ev.overlap_intervals(evs) == [(2000.0, 3000.0)]
    s = ev.summarize(evs)["GPU0"]
    assert s["overlap_ms"] == pytest.approx(1.0)
    assert s["compute_ms"] == pytest.approx(3.0)
    assert s["copy_ms"] == pytest.approx(2.0)
    assert s["window_ms"] == pytest.approx(4.0)
    assert s["comm_ms"] == pytest.approx(2.0)
    assert s["exposed_comm_ms"] == pytest.approx(1.0)  # [1, 2] ran before the GEMM started
    assert s["counts"] == {"gemm": 1, "copy": 1}


def test_summary_unions_streams_and_ignores_signals_and_nccl_for_copy_overlap():
    evs = [
        ev.GpuEvent(0, 0, 7, 0.0, 1000.0, CUTLASS, "kernel"),
        ev.GpuEvent(0, 0, 8, 500.0, 1000.0, CUTLASS, "kernel"),  # union 0..1500
        ev.GpuEvent(0, 0, 9, 100.0, 2.0, DTOD, "memcpy", 4),  # signal: not a copy
        ev.GpuEvent(0, 0, 10, 1400.0, 600.0, NCCL_AG, "kernel"),  # NCCL 1400..2000
        ev.GpuEvent(1, 1, 7, 0.0, 100.0, CUTLASS, "kernel"),
    ]
    s = ev.summarize(evs)
    assert set(s) == {"GPU0", "GPU1"}
    g0 = s["GPU0"]
    assert g0["compute_ms"] == pytest.approx(1.5)
    assert g0["copy_ms"] == 0.0 and g0["overlap_ms"] == 0.0
    assert g0["nccl_ms"] == pytest.approx(0.6)
    assert g0["exposed_comm_ms"] == pytest.approx(0.5)  # NCCL 1500..2000 not under a GEMM
    assert g0["window_ms"] == s["GPU1"]["window_ms"] == pytest.approx(2.0)
    assert s["GPU1"]["span_ms"] == pytest.approx(0.1)
    assert g0["counts"] == {"gemm": 2, "signal": 1, "nccl": 1}


# ------------------------------------------------------------------ lanes


def test_lanes_split_engines_and_overlapping_rows():
    evs = [
        ev.GpuEvent(0, 0, 7, 0.0, 10.0, CUTLASS, "kernel"),
        ev.GpuEvent(0, 0, 7, 2.0, 3.0, PTOP, "memcpy", 1 << 20),  # same stream, copy engine
        ev.GpuEvent(0, 0, 7, 5.0, 10.0, BARRIER, "kernel"),  # overlaps the GEMM: row 2
        ev.GpuEvent(0, 0, 7, 10.0, 5.0, CUTLASS, "kernel"),  # after the GEMM: row 1
        ev.GpuEvent(1, 1, 3, 0.0, 1.0, NCCL_AG, "kernel"),
        ev.GpuEvent(1, 1, -1, 0.0, 1.0, "call 0", "call"),
    ]
    labels, lane_of = rep.assign_lanes(evs)
    assert labels == [
        "GPU0 s7 kernels",
        "GPU0 s7 kernels #2",
        "GPU0 s7 memcpy",
        "GPU1 calls",
        "GPU1 s3 kernels",
    ]
    assert lane_of == [0, 2, 1, 0, 4, 3]
    # no two events of one lane overlap
    for lane in set(lane_of):
        iv = sorted((e.start, e.end) for e, ln in zip(evs, lane_of) if ln == lane)
        assert all(a[1] <= b[0] for a, b in zip(iv, iv[1:]))
    assert ev.gpu_label(1, 0) == "GPU0 (rank 1)"


# ------------------------------------------------------------------ chrome trace parsing


def test_parse_chrome_trace_round_trip():
    trace = rank_trace(1)
    parsed = ev.parse_chrome_trace(json.loads(json.dumps(trace)), rank=1)
    assert parsed.base_ns == 1_790_000_000_000_000_000
    assert parsed.markers == {f"{ev.MARKER_PREFIX}FC1:distgemm": (1000.0, 2100.0)}  # CPU side
    assert [e.kind for e in parsed.events] == [
        "kernel",
        "kernel",
        "kernel",
        "memcpy",
        "memcpy",
        "kernel",
    ]
    assert all(e.rank == 1 and e.device == 1 and e.stream == 7 for e in parsed.events)
    ptop = next(e for e in parsed.events if e.name == PTOP)
    assert (ptop.nbytes, ptop.start, ptop.dur, ptop.cls) == (64 << 20, 1020.0, 300.0, "copy")
    win = ev.in_window(parsed.events, *parsed.markers[f"{ev.MARKER_PREFIX}FC1:distgemm"])
    assert len(win) == 5  # the re-warm GEMM before the marker is out
    assert ev.class_counts(win) == {"other": 1, "gemm": 2, "copy": 1, "signal": 1}


def test_parse_tolerates_missing_fields():
    parsed = ev.parse_chrome_trace(
        {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "Kernel",
                    "name": NCCL_AG,
                    "pid": 3,
                    "tid": "stream 12",
                    "ts": 5,
                    "dur": -1,
                },
                {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},
                "garbage",
            ]
        }
    )
    assert parsed.base_ns == 0 and parsed.markers == {}
    (e,) = parsed.events
    assert (e.device, e.stream, e.dur, e.cls) == (3, 12, 0.0, "nccl")


# ------------------------------------------------------------------ alignment and sources


def _payload(rank, base_ns, t, gemm_name=CUTLASS):
    p = ev.parse_chrome_trace(rank_trace(rank, base_ns, t, gemm_name), rank)
    marker = p.markers[f"{ev.MARKER_PREFIX}FC1:distgemm"]
    return dict(
        base_ns=p.base_ns,
        marker=marker,
        events=ev.in_window(p.events, *marker),
        spans_ms=[(0.0, 0.5), (0.5, 1.0), (1.0, 1.02)],
        device=rank,
        marker_found=True,
        trace_gpu_events=len(p.events),
    )


def test_align_host_clock():
    # rank 1's base time is 2 ms later and its ts 1.9 ms smaller: the same host time + 100 us
    p0, p1 = _payload(0, 10_000_000, 5000.0), _payload(1, 12_000_000, 3100.0)
    events, info = ev.align({0: p0, 1: p1})
    assert info["alignment"] == "host clock"
    assert info["marker_skew_us"] == pytest.approx(100.0)
    assert events[0].start == 0.0 and events[0].rank == 0
    first1 = min(e.start for e in events if e.rank == 1)
    assert first1 == pytest.approx(100.0)


def test_align_falls_back_to_markers_when_clocks_disagree():
    p0, p1 = _payload(0, 10_000_000, 5000.0), _payload(1, 10_000_000, 900_000.0)
    events, info = ev.align({0: p0, 1: p1})
    assert info["alignment"] == "window markers"
    firsts = [min(e.start for e in events if e.rank == r) for r in (0, 1)]
    assert firsts == [pytest.approx(0.0), pytest.approx(0.0)]


def test_choose_source():
    ok = ev.parse_chrome_trace(rank_trace(0)).events
    no_gemm = [e for e in ok if e.cls != "gemm"]
    assert ev.choose_source("distgemm", {0: ok, 1: ok}) == ("profiler", "")
    src, note = ev.choose_source("distgemm", {0: ok, 1: no_gemm})
    assert src == "cuda-events" and "rank 1" in note and "no GEMM kernel" in note
    src, note = ev.choose_source("baseline", {0: ok, 1: []})
    assert src == "cuda-events" and "no GPU event" in note
    src, note = ev.choose_source("baseline", {0: no_gemm, 1: ok})
    assert src == "profiler" and "rank 0: no kernel recognised as a GEMM" in note


def test_build_variant_profiler_and_fallback():
    payloads = {0: _payload(0, 10_000_000, 5000.0), 1: _payload(1, 10_000_000, 5040.0)}
    rec = ev.build_variant("distgemm", payloads, 3, 0.33)
    assert rec["source"] == "profiler" and rec["alignment"] == "host clock"
    assert rec["ms_per_call_window"] == pytest.approx(1.02 / 3)
    assert rec["ms_per_call_trace"] == pytest.approx((1040.0 + 1015.0 - 1005.0) / 1e3 / 3)
    assert rec["counts"]["0"] == {"other": 1, "gemm": 2, "copy": 1, "signal": 1}
    g = rec["summary"]["GPU0"]
    assert g["overlap_ms"] == pytest.approx(0.3) and g["copy_ms"] == pytest.approx(0.3)
    assert g["compute_ms"] == pytest.approx(1.0) and g["exposed_comm_ms"] == pytest.approx(0.0)

    # distgemm without GEMM kernels in the trace: call spans from the CUDA events instead
    bad = {
        r: dict(p, events=[e for e in p["events"] if e.cls != "gemm"]) for r, p in payloads.items()
    }
    fb = ev.build_variant("distgemm", bad, 3, 0.33)
    assert fb["source"] == "cuda-events" and "no GEMM kernel" in fb["note"]
    assert {e.cls for e in fb["events"]} == {"call"} and len(fb["events"]) == 6
    assert fb["summary"]["GPU1"]["calls_ms"] == pytest.approx(1.02)
    assert "first calls" in fb["alignment"]


# ------------------------------------------------------------------ records, JSON, pictures


def _layer(fallback=False):
    case = Case("70B", "FC1", 8192, 2)
    per_rank = {}
    for r in (0, 1):
        p = _payload(r, 10_000_000, 5000.0 + 30 * r)
        bad = dict(p, events=[e for e in p["events"] if e.cls != "gemm"])
        per_rank[r] = dict(
            ref_ms={"baseline": 0.4, "distgemm": 0.33},
            rel_err={"distgemm": 3e-3},
            unavailable={"symm_mem": "RuntimeError: no symmetric memory"},
            payloads={"baseline": p, "distgemm": bad if fallback else p},
        )
    return ev.layer_record(case, 2, 2, per_rank)


def test_layer_record_and_summary_lines():
    la = _layer()
    assert (la["m"], la["n"], la["k"], la["schedule"]) == (8192, 57344, 8192, "ag_rotate_a")
    assert la["shapes"] == {"a": [4096, 8192], "w": [28672, 8192], "out": [8192, 28672]}
    assert la["variants"]["symm_mem"]["status"] == "unavailable"
    assert la["variants"]["distgemm"]["markers_found"] is True
    text = "\n".join(rep.summary_lines(la))
    assert "70B/FC1/M8192/TP2 (8192x57344x8192, ag_rotate_a S=2)" in text
    assert "symm_mem  unavailable: RuntimeError: no symmetric memory" in text
    assert "GPU0: window" in text and "copy||GEMM overlap 0.300 (100% of copy)" in text
    assert "source: profiler" in text


def test_json_round_trip():
    layers = [_layer(), _layer(fallback=True)]
    meta = {"model": "70B", "date": "2026-11-23T10:00:00+00:00"}
    doc = json.loads(json.dumps(rep.encode_run(meta, layers)))
    assert doc["names"].count(CUTLASS) == 1  # long names stored once
    meta2, layers2 = rep.decode_run(doc)
    assert meta2 == meta
    for a, b in zip(layers, layers2):
        for v in a["variants"]:
            ea, eb = a["variants"][v]["events"], b["variants"][v]["events"]
            assert [(e.rank, e.device, e.stream, e.name, e.kind, e.nbytes, e.cls) for e in ea] == [
                (e.rank, e.device, e.stream, e.name, e.kind, e.nbytes, e.cls) for e in eb
            ]
            assert [x for e in eb for x in (e.start, e.dur)] == pytest.approx(
                [x for e in ea for x in (e.start, e.dur)], abs=1e-3
            )  # ns resolution kept
            assert a["variants"][v].get("summary") == b["variants"][v].get("summary")
    row = doc["layers"][0]["variants"]["distgemm"]["events"][0]
    assert len(row) == len(doc["event_fields"]) and row[-1] in ev.CLASSES
    assert (
        rep.output_stem("70B", ["FC1", "O"], "2026-11-23")
        == "2026-11-23-overlap-timeline-70B-FC1-O"
    )


@NEEDS_MPL
def test_plot_writes_png(tmp_path):
    path = tmp_path / "t.png"
    assert rep.plot_layer(_layer(), str(path)) is None
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    fb = tmp_path / "fb.png"  # the fallback panel renders too
    assert rep.plot_layer(_layer(fallback=True), str(fb)) is None and fb.stat().st_size > 10_000


def test_plot_without_events_says_why(tmp_path):
    la = _layer()
    for rec in la["variants"].values():
        rec["status"] = "unavailable"
    why = rep.plot_layer(la, str(tmp_path / "x.png"))
    assert why and not (tmp_path / "x.png").exists()


def test_outputs_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    meta = {"model": "70B", "date": "2026-11-23T10:00:00+00:00"}
    said = rep.write_outputs(meta, [_layer()], str(tmp_path))
    stem = tmp_path / "2026-11-23-overlap-timeline-70B-FC1"
    assert (stem.with_suffix(".json")).exists() and (stem.with_suffix(".txt")).exists()
    assert not list(tmp_path.glob("*.png"))
    assert "matplotlib unavailable" in said[-1] and "--replot" in said[-1]
    assert "GPU1: window" in stem.with_suffix(".txt").read_text()


@NEEDS_MPL
def test_replot_cli_without_torch(tmp_path, repo_root):
    meta = {"model": "70B", "date": "2026-11-23T10:00:00+00:00"}
    layers = [_layer(), dict(_layer(fallback=True), layer="O")]
    doc = tmp_path / "run.json"
    doc.write_text(json.dumps(rep.encode_run(meta, layers)))
    out = tmp_path / "pics"
    # torch made unimportable: --replot must need neither torch nor a GPU
    code = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = ['overlap_timeline.py', '--replot', {str(doc)!r}, '--out', {str(out)!r}]; "
        "runpy.run_module('benchmarks.timeline.overlap_timeline', run_name='__main__')"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "2026-11-23-overlap-timeline-70B-FC1.png",
        "2026-11-23-overlap-timeline-70B-O.png",
    ]
    assert not list(out.glob("*.json"))  # re-plotting writes pictures only
    assert all((out / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_step_breakdown_places_every_microsecond_of_a_step():
    # Two steps on one GPU (us): GEMMs on stream 7, NCCL and a symmetric-memory barrier on
    # stream 8 (partly under the GEMMs), an elementwise kernel between GEMMs, and gaps.
    def kernel(name, start, end, stream):
        return ev.GpuEvent(0, 0, stream, float(start), float(end - start), name, "kernel")

    events = [
        kernel(CUTLASS, 0, 100, 7),
        kernel(NCCL_AG, 50, 180, 8),
        kernel(CUTLASS, 150, 250, 7),
        kernel("triton_poi_fused_mul_silu_0", 260, 280, 7),
        kernel("void c10d::symmetric_memory::barrier_kernel(...)", 280, 300, 8),
        kernel(CUTLASS, 310, 400, 7),
        ev.GpuEvent(0, 0, 9, 390.0, 5.0, "Memcpy DtoD (Device -> Device)", "memcpy", 4),
    ]
    got = ev.step_breakdown(events, steps=2)
    per_step = {  # us over both steps, / 2 steps / 1000
        "window_ms": 400,
        "gemm_ms": 290,
        "comm_exposed_ms": 50 + 20,  # NCCL between the GEMMs (100..150), the barrier
        "other_exposed_ms": 20,
        "idle_ms": 10 + 10,  # 250..260 and 300..310
        "comm_ms": 130 + 20 + 5,
        "comm_hidden_ms": 50 + 30 + 5,  # NCCL under both GEMMs, the signal under the last
    }
    for key, us in per_step.items():
        assert got[key] == pytest.approx(us / 2000), key
    parts = ("gemm_ms", "comm_exposed_ms", "other_exposed_ms", "idle_ms")
    assert sum(got[p] for p in parts) == pytest.approx(got["window_ms"])
    assert got["gemm_kernels"] == 1.5
    assert ev.step_breakdown([], steps=3)["window_ms"] == 0.0
    with pytest.raises(ValueError, match="steps=0 must be at least 1"):
        ev.step_breakdown(events, steps=0)


def test_exported_trace_reads_back_what_the_profiler_wrote():
    # A stand-in for torch.profiler.profile: a kernel name with a control character (as real
    # traces hold) must not stop the read.
    class Prof:
        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                f.write('{"traceEvents": [{"name": "k\x01ernel", "ph": "X", "ts": 1, "dur": 2}]}')

    trace = ev.exported_trace(Prof())
    assert trace["traceEvents"][0]["name"] == "k\x01ernel"
    assert trace["traceEvents"][0]["dur"] == 2
