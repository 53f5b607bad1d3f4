"""Checks on the CUDA graphs that `distgemm_bench --graph-json` writes (layout in
cpp/examples/bench/graph_json.cpp): pure functions over the parsed JSON, so the CPU tests run
them on hand-written graphs and the GPU tests on the graphs the runtime captured.

check_graphs(doc) returns the problems found, in words (empty: every check holds):
  - node counts: the roles in each graph match its GraphStats, every node has a role, the
    kernel nodes are the GEMMs, the wait kernels and one entry barrier, the memcpy nodes the
    copies and the signals;
  - the GEMM chain: barrier -> GEMM 0 -> GEMM 1 -> ..., programmatic (PDL) edges exactly when
    the stats say so, and no edge from the side chain into a GEMM (GEMMs wait on flags only);
  - signals: each follows (through edges) the GEMM or copy it publishes and precedes every wait
    kernel of its device; each flag a node waits for is set by exactly one signal of the plan;
  - transfers: each GEMM or copy that writes a receive or staging slot leads to the op that
    consumes it: through edges on the same device, or through edges to a signal of the flag the
    consumer waits for.
"""

from collections import defaultdict

SIDE_ROLES = ("copy", "signal", "wait")


def successors(dev):
    """{node index: [successor indices]} of one device's graph."""
    out = defaultdict(list)
    for e in dev["edges"]:
        out[e["from"]].append(e["to"])
    return out


def reaches(dev, src, dst, succ=None):
    """True when a path of edges leads from node src to node dst (src != dst)."""
    succ = successors(dev) if succ is None else succ
    seen, todo = set(), list(succ[src])
    while todo:
        n = todo.pop()
        if n == dst:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(succ[n])
    return False


def nodes_of(dev, role, **fields):
    """Indices of the nodes with `role` whose fields equal `fields`."""
    return [
        i
        for i, n in enumerate(dev["nodes"])
        if n["role"] == role and all(n[k] == v for k, v in fields.items())
    ]


def _count_problems(r, dev):
    st, nodes = dev["stats"], dev["nodes"]
    roles = defaultdict(int)
    kinds = defaultdict(int)
    for n in nodes:
        roles[n["role"]] += 1
        kinds[n["kind"]] += 1
    problems = []
    want = {
        "gemm": st["gemm_nodes"],
        "copy": st["copy_nodes"],
        "signal": st["signal_nodes"],
        "wait": st["wait_kernels"],
        "barrier": 1,
    }
    for role, n in want.items():
        if roles[role] != n:
            problems.append(f"device {r}: {roles[role]} {role} nodes, the stats say {n}")
    if roles[""]:
        problems.append(f"device {r}: {roles['']} node(s) without a role")
    if kinds["kernel"] != st["gemm_nodes"] + st["wait_kernels"] + 1:
        problems.append(f"device {r}: {kinds['kernel']} kernel nodes, expected GEMMs + waits + 1")
    if kinds["memcpy"] != st["copy_nodes"] + st["signal_nodes"]:
        problems.append(f"device {r}: {kinds['memcpy']} memcpy nodes, expected copies + signals")
    if len(dev["gemms"]) != st["gemm_nodes"]:
        problems.append(
            f"device {r}: the plan has {len(dev['gemms'])} GEMMs, the graph stats differ"
        )
    return problems


def _chain_problems(r, dev):
    problems = []
    nodes = dev["nodes"]
    edges = {(e["from"], e["to"]): e["programmatic"] for e in dev["edges"]}
    chain = nodes_of(dev, "barrier") + [
        (nodes_of(dev, "gemm", gemm=i) or [None])[0] for i in range(len(dev["gemms"]))
    ]
    for i, (a, b) in enumerate(zip(chain, chain[1:])):
        if a is None or b is None or (a, b) not in edges:
            problems.append(f"device {r}: no edge into GEMM {i} from the previous chain node")
        elif edges[(a, b)] != (i > 0 and dev["stats"]["pdl"]):
            problems.append(
                f"device {r}: edge into GEMM {i} is programmatic={edges[(a, b)]}, "
                f"stats pdl={dev['stats']['pdl']}"
            )
    for (a, b), _ in edges.items():
        if nodes[b]["role"] == "gemm" and nodes[a]["role"] in SIDE_ROLES:
            problems.append(f"device {r}: GEMM {nodes[b]['gemm']} waits for a {nodes[a]['role']}")
    for i in nodes_of(dev, "gemm"):
        g = nodes[i]["gemm"]
        if sorted(nodes[i]["waits"]) != sorted(dev["gemms"][g]["waits"]):
            problems.append(
                f"device {r}: GEMM {g} waits for {nodes[i]['waits']}, the plan says "
                f"{dev['gemms'][g]['waits']}"
            )
    return problems


def _signal_problems(r, dev, succ):
    problems = []
    nodes = dev["nodes"]
    waits = nodes_of(dev, "wait")
    for s in nodes_of(dev, "signal"):
        n = nodes[s]
        if n["gemm"] >= 0:
            sources = nodes_of(dev, "gemm", gemm=n["gemm"])
        else:
            sources = nodes_of(dev, "copy", copy=n["copy"])
        if not sources or not all(reaches(dev, p, s, succ) for p in sources):
            what = f"GEMM {n['gemm']}" if n["gemm"] >= 0 else f"copy {n['copy']}"
            problems.append(
                f"device {r}: signal of flag {n['flag']} on device {n['peer']} "
                f"does not follow {what}"
            )
        for w in waits:
            if not reaches(dev, s, w, succ):
                problems.append(
                    f"device {r}: signal of flag {n['flag']} on device {n['peer']} "
                    f"does not precede the wait kernel of copy {nodes[w]['copy']}"
                )
    for w in waits:
        c = nodes[w]["copy"]
        if not all(reaches(dev, w, x, succ) for x in nodes_of(dev, "copy", copy=c)):
            problems.append(f"device {r}: the wait kernel of copy {c} does not precede the copy")
    return problems


def _in_slot(ref, dst, elems):
    return (
        ref is not None
        and ref["buffer"] == "slots"
        and ref["device"] == dst["device"]
        and dst["offset"] <= ref["offset"] < dst["offset"] + elems
    )


def _transfer_problems(devs, succs):
    """Every write into a slot reaches the op that reads it (edges, or a signal of its flag)."""
    problems = []
    for r, dev in enumerate(devs):
        writes = [
            ("GEMM", i, g["d"], g["elems"], nodes_of(dev, "gemm", gemm=i))
            for i, g in enumerate(dev["gemms"])
            if g["d"] and g["d"]["buffer"] == "slots"
        ] + [
            ("copy", j, c["dst"], c["elems"], nodes_of(dev, "copy", copy=j))
            for j, c in enumerate(dev["copies"])
            if c["dst"]["buffer"] == "slots"
        ]
        for what, idx, dst, elems, producers in writes:
            e = dst["device"]
            consumers = [
                ("gemm", i, g["waits"])
                for i, g in enumerate(devs[e]["gemms"])
                if any(_in_slot(g[k], dst, elems) for k in ("a", "b", "partial"))
            ] + [
                ("copy", j, c["waits"])
                for j, c in enumerate(devs[e]["copies"])
                if _in_slot(c["src"], dst, elems)
            ]
            if not consumers:
                problems.append(
                    f"device {r}: {what} {idx} writes a slot of device {e} nobody reads"
                )
            for role, ci, flags in consumers:
                if not flags and e == r:
                    targets = nodes_of(dev, role, **{"gemm" if role == "gemm" else "copy": ci})
                    ok = all(reaches(dev, p, t, succs[r]) for p in producers for t in targets)
                else:
                    signals = [s for f in flags for s in nodes_of(dev, "signal", peer=e, flag=f)]
                    ok = bool(producers) and all(
                        any(reaches(dev, p, s, succs[r]) for s in signals) for p in producers
                    )
                if not ok:
                    problems.append(
                        f"device {r}: {what} {idx} does not lead to {role} {ci} of device {e} "
                        f"that reads its slot (waits {flags})"
                    )
    return problems


def _flag_problems(devs):
    """Every flag a node waits for is set by exactly one signal node of the plan."""
    setters = defaultdict(int)
    for dev in devs:
        for n in dev["nodes"]:
            if n["role"] == "signal":
                setters[(n["peer"], n["flag"])] += 1
    problems = []
    for r, dev in enumerate(devs):
        for n in dev["nodes"]:
            for f in n["waits"]:
                if setters[(r, f)] != 1:
                    problems.append(
                        f"device {r}: flag {f} that a {n['role']} waits for is set by "
                        f"{setters[(r, f)]} signal nodes"
                    )
    return problems


def check_graphs(doc):
    """The problems of a --graph-json document, in words; [] when every check holds."""
    devs = doc["devices"]
    problems = []
    if len(devs) != doc["tp"] or [d["rank"] for d in devs] != list(range(doc["tp"])):
        return [f"expected the graphs of ranks 0..{doc['tp'] - 1}"]
    succs = [successors(dev) for dev in devs]
    for r, dev in enumerate(devs):
        problems += _count_problems(r, dev)
        problems += _chain_problems(r, dev)
        problems += _signal_problems(r, dev, succs[r])
    problems += _transfer_problems(devs, succs)
    problems += _flag_problems(devs)
    return problems
