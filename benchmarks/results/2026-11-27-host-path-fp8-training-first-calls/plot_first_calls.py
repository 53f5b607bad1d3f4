"""Plots the first-call ms per token count at TP=4, distgemm against the torch baseline (NCCL +
torch.mm in its own process), from this folder's first-call-tp4-distgemm.json and
first-call-tp4-torch.json (call 4), into first-calls-tp4.png; run from the repository root:

    python3 benchmarks/results/2026-11-27-host-path-fp8-training-first-calls/plot_first_calls.py
"""

import io
import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path("benchmarks/results/2026-11-27-host-path-fp8-training-first-calls")
GPU = "4x NVIDIA H100 80GB HBM3"
OPS = ("all_gather_gemm", "gemm_reduce_scatter")


def calls(name: str) -> list[dict]:
    return json.loads((HERE / name).read_text())["calls"]


def main() -> None:
    dg, torch_ = calls("first-call-tp4-distgemm.json"), calls("first-call-tp4-torch.json")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, op in zip(axes, OPS):
        t = sorted((c["m"], c["ms"]) for c in torch_ if c["op"] == op)
        ax.plot([m for m, _ in t], [v for _, v in t], "o-", ms=3, lw=0.8, color="tab:gray",
                label=f"torch: NCCL + torch.mm (median {statistics.median(v for _, v in t):.2f} ms)")
        for path, marker, color in (("overlap", "s", "tab:blue"), ("collective", "^", "tab:orange")):
            d = sorted((c["m"], c["ms"]) for c in dg if c["op"] == op and c["path"] == path)
            if d:
                ax.plot([m for m, _ in d], [v for _, v in d], marker, ms=4, color=color,
                        label=f"distgemm, {path} path ({len(d)} calls)")
        d_all = [c["ms"] for c in dg if c["op"] == op]
        ax.set_title(f"{op}: distgemm median {statistics.median(d_all):.2f} ms")
        ax.set_xlabel("token count (M), each one's first call")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("first call ms (until the result is ready, max over ranks)")
    fig.suptitle(f"First calls of 96 new token counts, TP=4, K=4096, N=3072, {GPU}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    out = HERE / "first-calls-tp4.png"
    try:  # stored with a palette of 32 colours (benchmarks/results/README.md)
        from PIL import Image

        Image.open(buf).convert("RGB").quantize(colors=32).save(out, optimize=True)
    except ImportError:
        out.write_bytes(buf.getvalue())
    print("wrote", out)


if __name__ == "__main__":
    main()
