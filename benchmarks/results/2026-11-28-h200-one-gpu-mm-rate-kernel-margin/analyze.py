"""The write-up's tables, CSV and plot from fused-tp1.json (calls 1-2), no GPU:

    python3 benchmarks/results/2026-11-28-h200-one-gpu-mm-rate-kernel-margin/analyze.py

torch.mm per call against (a) the shipped H200 decode model's torch.mm (``reduce.mm`` of
nvidia-h200-tp2-nvlink18.json and -tp4-: launch + bytes * per_byte + flops * per_flop) and
(b) launch + bytes / bandwidth fitted per token count to the 18 Llama-3 shapes only, which then
predicts the 6 Qwen2.5-32B shapes it was not fitted on."""

import csv
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

HERE = pathlib.Path(__file__).parent
MACHINES = HERE.parents[2] / "python" / "distgemm" / "data" / "machines"
recs = json.load(open(HERE / "fused-tp1.json"))["timing"]  # noqa: SIM115
shipped = {
    tp: json.load(open(MACHINES / f"nvidia-h200-tp{tp}-nvlink18.json"))["reduce"]["mm"]
    for tp in (2, 4)
}


def nbytes(r):
    return 2.0 * (r["n"] * r["k"] + r["m"] * r["k"] + r["m"] * r["n"])


def shipped_us(tp, r):
    c = shipped[tp]
    return (c[0] + c[1] * nbytes(r) + c[2] * 2.0 * r["m"] * r["n"] * r["k"]) * 1e3


rows = []
for m in sorted({r["m"] for r in recs}):
    at = [r for r in recs if r["m"] == m]
    llama = [r for r in at if r["n"] != 5120]
    x = np.array([[1.0, nbytes(r)] for r in llama])
    coef, *_ = np.linalg.lstsq(x, np.array([r["mm_us"] for r in llama]), rcond=None)
    for r in at:
        fit = coef[0] + coef[1] * nbytes(r)
        rows.append(dict(
            m=m, n=r["n"], k=r["k"], family="qwen2.5-32b" if r["n"] == 5120 else "llama3",
            held_out=r["n"] == 5120, weight_copies=r["weight_copies"], mm_us=r["mm_us"],
            fused_us=r["fused_us"], fused_over_mm=r["fused_us"] / r["mm_us"],
            fit_launch_us=coef[0], fit_tb_s=1e-6 / coef[1], fit_us=fit,
            mm_over_fit=r["mm_us"] / fit,
            shipped_tp2_us=shipped_us(2, r), mm_over_shipped_tp2=r["mm_us"] / shipped_us(2, r),
            shipped_tp4_us=shipped_us(4, r), mm_over_shipped_tp4=r["mm_us"] / shipped_us(4, r),
        ))  # fmt: skip
with open(HERE / "fused-tp1.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()})

for m in sorted({r["m"] for r in rows}):
    at = [r for r in rows if r["m"] == m]
    r0 = at[0]
    print(f"m={m}: Llama fit launch {r0['fit_launch_us']:.2f} us, {r0['fit_tb_s']:.2f} TB/s")
    for key in ("mm_over_fit", "mm_over_shipped_tp2", "mm_over_shipped_tp4"):
        for held in (False, True):
            v = [r[key] for r in at if r["held_out"] == held]
            print(f"  {key:22s} {'qwen (held out)' if held else 'llama':16s} "
                  f"min {min(v):.3f} max {max(v):.3f}")  # fmt: skip
    over = [f"{r['n']}x{r['k']} {r['mm_over_fit']:.3f}" for r in at if r["mm_over_fit"] > 1.05]
    print("  above the fit by > 5%:", ", ".join(over))

fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
for n, marker in ((4096, "o"), (5120, "D"), (8192, "s"), (16384, "^")):
    for m, color in ((1, "C0"), (16, "C1"), (64, "C2")):
        at = [r for r in rows if r["n"] == n and r["m"] == m]
        kn = [r["k"] / r["n"] for r in at]
        axes[0].scatter(kn, [r["mm_over_fit"] for r in at], marker=marker, color=color,
                        label=f"N={n}, m={m}")  # fmt: skip
        axes[1].scatter(kn, [r["fused_over_mm"] for r in at], marker=marker, color=color)
axes[0].axhline(1.0, color="k", lw=0.5)
axes[0].set(xscale="log", xlabel="K / N", ylabel="torch.mm / (launch + bytes / bandwidth)",
            title="torch.mm against a bytes model fitted to Llama-3 shapes")  # fmt: skip
axes[1].axhline(1.0, color="k", lw=0.5)
axes[1].set(xscale="log", xlabel="K / N", ylabel="fused (TP=1) / torch.mm",
            title="the fused op at TP=1 against torch.mm")  # fmt: skip
for ax in axes:
    ax.set_xticks([0.125, 0.25, 0.5, 1, 2])
    ax.set_xticklabels(["1/8", "1/4", "1/2", "1", "2"])
    ax.minorticks_off()
axes[0].legend(fontsize=6, ncol=2)
fig.suptitle("NVIDIA H200, one GPU, cold weights, CUDA graphs of 20 calls (session 19 calls 1-2)")
fig.tight_layout()
fig.savefig(HERE / "fused-tp1.png", dpi=110)
Image.open(HERE / "fused-tp1.png").convert("RGB").quantize(colors=32).save(
    HERE / "fused-tp1.png", optimize=True
)  # the results' palette of 32 colours (benchmarks/results/README.md)
