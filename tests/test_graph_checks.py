"""The CUDA-graph checks of tests/gpu/graph_checks.py on the CPU: two hand-written graphs
(ag_rotate_a and ar_tile_a at TP=2, S=2, as the runtime captures them) pass and each broken
copy fails with the problem named; the graph every schedule's plan gives when issued as the
runtime issues it passes."""

import copy
import importlib.util
import pathlib

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "graph_checks", pathlib.Path(__file__).resolve().parent / "gpu" / "graph_checks.py"
)
graph_checks = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(graph_checks)


def node(kind, role, gemm=-1, copy=-1, peer=-1, flag=-1, waits=()):
    return dict(kind=kind, role=role, gemm=gemm, copy=copy, peer=peer, flag=flag, waits=list(waits))


def ref(buffer, device, offset=0):
    return dict(buffer=buffer, device=device, offset=offset)


def edges(*pairs, programmatic=()):
    return [dict(zip(("from", "to"), p), programmatic=p in programmatic) for p in pairs]


def stats(gemm, copy, signal, wait, pdl):
    return dict(
        gemm_nodes=gemm,
        copy_nodes=copy,
        signal_nodes=signal,
        wait_kernels=wait,
        pdl=pdl,
        gemm_n128=0,
    )


def gemm(it, a, d, waits=(), signals=(), partial=None, elems=8):
    return dict(
        iteration=it,
        waits=list(waits),
        signals=[list(s) for s in signals],
        a=a,
        b=ref("B", a["device"]),
        partial=partial,
        d=d,
        elems=elems,
    )


def copy_op(src, dst, after_gemm=-1, waits=(), signals=(), elems=8):
    return dict(
        src=src,
        dst=dst,
        elems=elems,
        after_gemm=after_gemm,
        waits=list(waits),
        signals=[list(s) for s in signals],
    )


def device(r, stats, side_nodes, edges, gemms, copies):
    """Device r of a TP=2, S=2 graph: the entry barrier and two chained GEMMs (GEMM 1 waits for
    flag 0), then `side_nodes`."""
    chain = [
        node("kernel", "barrier"),
        node("kernel", "gemm", gemm=0),
        node("kernel", "gemm", gemm=1, waits=[0]),
    ]
    return dict(
        rank=r, stats=stats, nodes=chain + side_nodes, edges=edges, gemms=gemms, copies=copies
    )


def ag_rotate_a():
    """Each device pushes its A rows into the peer's slot 0 (copy, then signal of flag 0); GEMM 1
    reads slot 0 after waiting for flag 0; the GEMMs chained by PDL."""
    devices = [
        device(
            r,
            stats(2, 1, 1, 0, True),
            [node("memcpy", "copy", copy=0), node("memcpy", "signal", copy=0, peer=1 - r, flag=0)],
            edges((0, 1), (1, 2), (0, 3), (3, 4), programmatic=[(1, 2)]),
            [
                gemm(0, ref("A", r), ref("D", r)),
                gemm(1, ref("slots", r), ref("D", r, 8), waits=[0]),
            ],
            [copy_op(ref("A", r), ref("slots", 1 - r), signals=[(1 - r, 0)])],
        )
        for r in range(2)
    ]
    return dict(schedule="ag_rotate_a", tp=2, steps=2, partial_via="epilogue", devices=devices)


def ar_tile_a():
    """GEMM 0 writes its partial into the peer's slot 0 and signals flag 0; GEMM 1 adds it and
    finishes a tile, which copy 0 pushes into the peer's slot 1 (flag 1); after every signal,
    a wait kernel on flag 1 and copy 1 takes the peer's finished tile into D."""
    devices = []
    for r in range(2):
        e = 1 - r
        side = [
            node("memcpy", "signal", gemm=0, peer=e, flag=0),
            node("memcpy", "copy", copy=0),
            node("memcpy", "signal", copy=0, peer=e, flag=1),
            node("kernel", "wait", copy=1, waits=[1]),
            node("memcpy", "copy", copy=1),
        ]
        gemms = [
            gemm(0, ref("A", r), ref("slots", e), signals=[(e, 0)]),
            gemm(1, ref("A", r), ref("D", r), waits=[0], partial=ref("slots", r)),
        ]
        copies = [
            copy_op(ref("D", r), ref("slots", e, 8), after_gemm=1, signals=[(e, 1)]),
            copy_op(ref("slots", r, 8), ref("D", r, 8), waits=[1]),
        ]
        ring = edges((0, 1), (1, 2), (0, 3), (1, 3), (3, 4), (2, 4), (4, 5), (5, 6), (6, 7))
        devices.append(device(r, stats(2, 2, 2, 1, False), side, ring, gemms, copies))
    return dict(schedule="ar_tile_a", tp=2, steps=2, partial_via="epilogue", devices=devices)


@pytest.mark.parametrize("make", [ag_rotate_a, ar_tile_a], ids=lambda f: f.__name__)
def test_correct_graphs_pass(make):
    assert graph_checks.check_graphs(make()) == []


def test_reaches_follows_edges_only_forward():
    dev = ag_rotate_a()["devices"][0]
    assert graph_checks.reaches(dev, 0, 4) and graph_checks.reaches(dev, 1, 2)
    assert not graph_checks.reaches(dev, 4, 0) and not graph_checks.reaches(dev, 2, 3)


def _drop_edge(dev, a, b):
    dev["edges"] = [e for e in dev["edges"] if (e["from"], e["to"]) != (a, b)]


def _break(make, mutate):
    doc = copy.deepcopy(make())
    mutate(doc["devices"][0])
    return graph_checks.check_graphs(doc)


@pytest.mark.parametrize(
    "make,mutate,message",
    [
        (ag_rotate_a, lambda d: _drop_edge(d, 1, 2), "device 0: no edge into GEMM 1"),
        (ag_rotate_a, lambda d: d["edges"][1].update(programmatic=False), "is programmatic=False"),
        (ar_tile_a, lambda d: d["edges"][1].update(programmatic=True), "stats pdl=False"),
        (
            ag_rotate_a,
            lambda d: d["edges"].append(dict(programmatic=False, **{"from": 4, "to": 2})),
            "GEMM 1 waits for a signal",
        ),
        (ag_rotate_a, lambda d: _drop_edge(d, 3, 4), "does not follow copy 0"),
        (ag_rotate_a, lambda d: _drop_edge(d, 3, 4), "copy 0 does not lead to gemm 1 of device 1"),
        (ag_rotate_a, lambda d: d["nodes"][4].update(flag=5), "set by 0 signal nodes"),
        (ag_rotate_a, lambda d: d["stats"].update(copy_nodes=2), "1 copy nodes, the stats say 2"),
        (ag_rotate_a, lambda d: d["nodes"][3].update(role=""), "node(s) without a role"),
        (ag_rotate_a, lambda d: d["nodes"][2].update(waits=[]), "GEMM 1 waits for []"),
        (ar_tile_a, lambda d: _drop_edge(d, 5, 6), "does not precede the wait kernel"),
        (ar_tile_a, lambda d: _drop_edge(d, 6, 7), "wait kernel of copy 1 does not precede"),
        (
            ar_tile_a,
            lambda d: d["gemms"][1].update(partial=None),
            "device 1: GEMM 0 writes a slot of device 0 nobody reads",
        ),
    ],
    ids=[
        "chain-edge-missing",
        "pdl-edge-not-programmatic",
        "programmatic-without-pdl",
        "gemm-waits-for-side-chain",
        "signal-before-its-copy",
        "copy-not-reaching-consumer",
        "signal-sets-wrong-flag",
        "count-differs-from-stats",
        "untagged-node",
        "gemm-waits-differ-from-plan",
        "signal-after-wait-kernel",
        "wait-kernel-after-copy",
        "slot-never-read",
    ],
)
def test_broken_graphs_are_named(make, mutate, message):
    problems = _break(make, mutate)
    assert any(message in p for p in problems), problems


def capture_model(plan, r):
    """The graph device r's runtime captures for `plan` (a _core.build_plan dict), the way
    cpp/src/runtime/graph.cu issues it: entry barrier, the GEMM chain (PDL where
    device::pdl_by_default says), then ONE side chain ordered by the GEMM each node follows,
    a wait kernel before each copy that waits for a flag. Every node depends on its stream's
    previous node and on the GEMMs the stream waited for."""
    prog = plan["devices"][r]
    gemms, copies, steps = prog["gemms"], prog["copies"], len(prog["gemms"])
    pdl = plan["definition"]["collective"] == "all_gather" or plan["partial_via"] == "copy"
    dev = dict(rank=r, nodes=[node("kernel", "barrier")], edges=[], gemms=[], copies=[])

    def add(deps, n, programmatic=False):
        dev["nodes"].append(n)
        i = len(dev["nodes"]) - 1
        dev["edges"] += [dict(programmatic=programmatic, **{"from": d, "to": i}) for d in deps]
        return [i]

    gemm_deps, side_deps, gemm_node = [0], [0], []
    for i, g in enumerate(gemms):
        gemm_deps = add(gemm_deps, node("kernel", "gemm", gemm=i, waits=g["waits"]), pdl and i > 0)
        gemm_node += gemm_deps
    side = [(i, -1) for i, g in enumerate(gemms) if g["signals"]]
    side += [(steps if c["waits"] else c["after_gemm"], j) for j, c in enumerate(copies)]
    waited = -1
    for key, j in sorted(side, key=lambda s: s[0]):  # stable: signals first within a key
        if min(key, steps - 1) > waited:
            waited = min(key, steps - 1)
            side_deps = side_deps + [gemm_node[waited]]
        signals = gemms[key]["signals"] if j < 0 else copies[j]["signals"]
        if j >= 0:
            if copies[j]["waits"]:
                side_deps = add(side_deps, node("kernel", "wait", copy=j, waits=copies[j]["waits"]))
            side_deps = add(side_deps, node("memcpy", "copy", copy=j))
        for f in signals:
            publishes = dict(gemm=key) if j < 0 else dict(copy=j)
            n = node("memcpy", "signal", peer=f["device"], flag=f["flag"], **publishes)
            side_deps = add(side_deps, n)
    count = {
        role: sum(n["role"] == role for n in dev["nodes"])
        for role in graph_checks.SIDE_ROLES + ("gemm",)
    }
    dev["stats"] = stats(
        count["gemm"], count["copy"], count["signal"], count["wait"], pdl and steps > 1
    )
    l = plan["problem"]["l"]
    dev["gemms"] = [dict(g, elems=l * g["m"] * g["n"]) for g in gemms]
    dev["copies"] = [dict(c, elems=l * c["rows"] * c["cols"]) for c in copies]
    return dev


PLANS = [
    (s, tp, steps, via)
    for s in ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a")
    for tp in (2, 4)
    for steps in (tp, 2 * tp)
    for via in (None, "epilogue", "copy")
    if via is None or not s.startswith("ag_")
]


@pytest.mark.parametrize(
    "schedule,tp,steps,via",
    PLANS,
    ids=[f"{s}-tp{t}-S{st}-{v or 'default'}" for s, t, st, v in PLANS],
)
def test_the_plans_captured_graphs_pass(schedule, tp, steps, via):
    """Every schedule's plan, issued as the runtime issues it, passes every check: the checks
    hold for correct graphs, so a GPU failure points at the captured graph, not at them."""
    from distgemm import _core

    plan = _core.build_plan(schedule, tp, steps, 256 * tp, 256 * tp, 128 * tp, 2, partial_via=via)
    plan = plan.to_dict() if hasattr(plan, "to_dict") else plan
    doc = dict(schedule=schedule, tp=tp, steps=steps, partial_via=plan["partial_via"])
    doc["devices"] = [capture_model(plan, r) for r in range(tp)]
    assert graph_checks.check_graphs(doc) == []
