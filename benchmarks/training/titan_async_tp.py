"""A real training client: torchtitan's Llama-3 with torch's async-TP, distgemm's switch on or off.

    torchrun --nproc-per-node N -m benchmarks.training.titan_async_tp --switch off --out OFF.json
    torchrun --nproc-per-node N -m benchmarks.training.titan_async_tp --switch on --out ON.json
    python3 -m benchmarks.training.titan_compare OFF.json ON.json  # losses agree? tokens/s on/off
    torchrun --nproc-per-node 2 -m benchmarks.training.titan_async_tp --cpu-smoke --switch off \\
        --out SMOKE.json  # gloo, torchtitan's debug shapes, no compile or async-TP

TP = N = world size (no data parallelism). What runs is torchtitan's own code (a release that runs
on torch 2.11: v0.2.2, see benchmarks/training/TITAN.md):

- the model: ``torchtitan.models.llama3``'s ``Transformer`` with the ``8B`` flavor's layer shapes
  (dim 4096, 32 heads, 8 KV heads, FFN 14336, vocabulary 128256) and ``--layers`` layers, built on
  the meta device and initialised by its ``init_weights`` after ``to_empty``, as the trainer does;
- the parallelism: ``torchtitan.models.llama3.parallelize_llama`` with a ``JobConfig`` that turns on
  TP, ``enable_async_tensor_parallel`` and per-block ``torch.compile`` (inductor), activation
  checkpointing off; torchtitan's TP plan (sequence parallel, loss parallel);
- the step: ``torchtitan.components.loss.build_cross_entropy_loss`` (sum over tokens, compiled),
  divided by the tokens, under ``get_train_context`` (loss parallel), ``build_optimizers``
  (AdamW, torchtitan's defaults but a constant learning rate: its warm-up would keep the
  rate near 0 for 50 steps), ``clip_grad_norm_`` at 1.0, seeds by ``set_determinism``.

Two things differ from torchtitan's trainer, both said in the JSON:

- the parameters are bf16 (cast after init; the RoPE table recomputed in complex64): the
  trainer applies bf16 only through FSDP's mixed precision, so at TP alone it trains in fp32,
  where every fused op goes to torch's kernel (distgemm serves bf16/fp16);
- ``enable_symm_mem_for_group`` on the TP group: torch 2.11's micro-pipeline TP pass fuses
  only for groups registered so (``is_symm_mem_enabled_for_group``), and torchtitan v0.2.2 no
  longer registers (its own later fix, #4045, does it again); without it async-TP fuses nothing.

The data are random token ids: ``--pool`` fixed sequences (seed ``--seed``), cycled step by step, so
the loss falls as the model memorises them and two runs can be compared step by step. tokens/s
counts ``batch * seq`` tokens per step over the steps after ``--warmup`` (which include the
compilation), timed with the device synchronised at each step's end. ``--switch on`` calls
``distgemm.compat.async_tp.install()`` before the first step; the JSON records
``routing_stats()`` after the last, and how many fused ops torch's pass put into the compiled
graphs (the pass's two insert functions counted).

Exit status: 0 done; 2 torchtitan (or another requirement) missing or an argument refused,
with one line saying which; 1 anything else (a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import sys
import time
import warnings
from typing import Any

TITAN_RELEASE = "0.2.2"  # the torchtitan release this client is written against (TITAN.md)
FLAVOR = "8B"  # Llama-3-8B's layer shapes, --layers of them
SMOKE_FLAVOR = "debugmodel"  # --cpu-smoke: dim 256, vocabulary 2048
SMOKE_DEFAULTS = dict(layers=2, steps=3, seq=64, batch=2, warmup=1)
MISSING_EXIT = 2


class Missing(Exception):
    """A requirement of the client is missing: one line, exit status 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks.training.titan_async_tp",
        description="torchtitan Llama-3 (8B layer shapes, few layers) at TP = world size, torch's "
        "async-TP on, distgemm's switch on or off; tokens/s and per-step losses as JSON.",
    )
    p.add_argument("--switch", choices=("on", "off"), required=True, help="distgemm's switch")
    p.add_argument("--layers", type=int, default=None, help="transformer blocks (default 4)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 50)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 8192)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 1)")
    p.add_argument("--warmup", type=int, default=None, help="steps left out of tokens/s (5)")
    p.add_argument("--pool", type=int, default=4, help="distinct random sequences, cycled")
    p.add_argument("--seed", type=int, default=0, help="init and data seed")
    p.add_argument(
        "--lr",
        type=float,
        default=3e-5,
        help="AdamW's constant learning rate (default 3e-5: small steps keep the loss curve "
        "smooth, so that two runs differing only in bf16 rounding stay comparable over the steps; "
        "benchmarks/training/TITAN.md)",
    )
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="parameter dtype")
    p.add_argument(
        "--automatic-dynamic",
        choices=("on", "off"),
        default="on",
        help="dynamo's automatic dynamic shapes (default on, torch's default, as a torchtitan "
        "user runs; off keeps a recompile static)",
    )
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help=f"gloo on CPU, torchtitan's {SMOKE_FLAVOR} shapes, no compile or async-TP "
        f"(defaults {SMOKE_DEFAULTS})",
    )
    args = p.parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.cpu_smoke else dict(layers=4, steps=50, seq=8192, batch=1)
    defaults.setdefault("warmup", 5)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("layers", "steps", "seq", "batch", "pool"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)} must be at least 1")
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup={args.warmup} must be at least 0 and below --steps={args.steps}")
    return args


def check_env_agrees(switch: str, env: dict[str, str]) -> None:
    """DISTGEMM_ASYNC_TP=1 installs the switch at the import of distgemm.compat: refuse it with
    --switch off (the run would not be what it says)."""
    if switch == "off" and env.get("DISTGEMM_ASYNC_TP", "") == "1":
        raise Missing("--switch off with DISTGEMM_ASYNC_TP=1 in the environment: unset it")


def import_titan():
    """torchtitan's pieces this client runs, as a namespace; Missing (one line) without them."""
    try:
        import torchtitan
        from torchtitan.components.loss import build_cross_entropy_loss
        from torchtitan.components.optimizer import build_optimizers
        from torchtitan.config import JobConfig
        from torchtitan.distributed import ParallelDims, parallel_dims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.models.llama3 import Transformer, llama3_args, parallelize_llama
    except ImportError as ex:
        raise Missing(
            f"torchtitan {TITAN_RELEASE} and its wheels are needed ({type(ex).__name__}: {ex}); "
            "benchmarks/training/TITAN.md lists them"
        ) from None
    return argparse.Namespace(
        version=getattr(torchtitan, "__version__", "unknown"),
        build_cross_entropy_loss=build_cross_entropy_loss,
        build_optimizers=build_optimizers,
        JobConfig=JobConfig,
        ParallelDims=ParallelDims,
        dist_utils=dist_utils,
        Transformer=Transformer,
        llama3_args=llama3_args,
        parallelize_llama=parallelize_llama,
        cpu_device_modules=(parallel_dims, dist_utils),
    )


def job_config(titan, args: argparse.Namespace, tp: int):
    """torchtitan's JobConfig for this run: TP = world size, async-TP and compile (not in the
    CPU smoke), no activation checkpointing, constant learning rate."""
    jc = titan.JobConfig()
    jc.training.seq_len = args.seq
    jc.training.local_batch_size = args.batch
    jc.parallelism.tensor_parallel_degree = tp
    jc.parallelism.data_parallel_shard_degree = 1
    jc.parallelism.enable_async_tensor_parallel = not args.cpu_smoke
    jc.compile.enable = not args.cpu_smoke
    jc.compile.components = ["model", "loss"]
    jc.activation_checkpoint.mode = "none"
    jc.optimizer.lr = args.lr
    if args.cpu_smoke:
        jc.optimizer.implementation = "foreach"
    jc.debug.seed = args.seed
    return jc


class FusionCounter:
    """How many fused ops torch's micro-pipeline TP pass inserted into compiled graphs: its two
    insert functions wrapped (None where this torch has no such function)."""

    NAMES = {
        "fused_all_gather_matmul": "_insert_fused_all_gather_matmul",
        "fused_matmul_reduce_scatter": "_insert_fused_matmul_reduce_scatter",
    }

    def __init__(self):
        from torch._inductor.fx_passes import micro_pipeline_tp as pass_module

        self.counts: dict[str, int | None] = {}
        for op, fn_name in self.NAMES.items():
            fn = getattr(pass_module, fn_name, None)
            self.counts[op] = None if fn is None else 0
            if fn is not None:
                setattr(pass_module, fn_name, self._counting(op, fn))

    def _counting(self, op, fn):
        def wrapped(*a, **k):
            self.counts[op] += 1
            return fn(*a, **k)

        return wrapped


def token_pool(torch, args, vocab: int, device):
    """``--pool`` sequences of ``seq + 1`` random token ids, the same on every rank and run."""
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.pool, args.seq + 1), generator=g)
    return ids.to(device)


def batch_at(pool, step: int, batch: int):
    """Step ``step``'s (inputs, labels): ``batch`` sequences of the pool, cycled."""
    rows = [(step * batch + i) % pool.shape[0] for i in range(batch)]
    seqs = pool[rows]
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


def routing_record() -> dict[str, Any]:
    """distgemm's routing_stats() as JSON: installed, and per op served and fallbacks."""
    from distgemm.compat import async_tp

    s = async_tp.routing_stats()
    ops = {n: dict(served=o.served, fallbacks=dict(o.fallbacks)) for n, o in s.ops.items()}
    return dict(installed=s.installed, served=s.served, fallen_back=s.fallen_back, ops=ops)


def versions(torch, titan) -> dict[str, Any]:
    import distgemm

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return dict(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=device,
        torchtitan=titan.version,
        distgemm=getattr(distgemm, "__version__", "unknown"),
        python=sys.version.split()[0],
        installed_by=os.environ.get("INSTALLED_BY"),
    )


def build_model(torch, titan, args, jc, parallel_dims, device):
    """torchtitan's Transformer (FLAVOR shapes, --layers blocks) on the meta device, parallelised
    by parallelize_llama, materialised and initialised, cast to --dtype."""
    flavor = SMOKE_FLAVOR if args.cpu_smoke else FLAVOR
    model_args = dataclasses.replace(titan.llama3_args[flavor], n_layers=args.layers)
    model_args.update_from_config(jc)
    with torch.device("meta"):
        model = titan.Transformer(model_args)
    model = titan.parallelize_llama(model, parallel_dims, jc)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    if args.dtype == "bf16":
        with warnings.catch_warnings():  # the complex RoPE table is recomputed right after
            warnings.simplefilter("ignore")
            model.to(torch.bfloat16)
        with torch.device(device):
            model.freqs_cis = model._precompute_freqs_cis()
    model.train()
    return model, model_args


def train(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch._dynamo
    import torch.distributed as dist

    titan = import_titan()
    torch._dynamo.config.automatic_dynamic_shapes = args.automatic_dynamic == "on"
    if args.switch == "on":
        from distgemm.compat import async_tp

        async_tp.install()
    else:
        import distgemm.compat  # noqa: F401  (routing_stats; the env agrees, checked before)

    backend = "gloo" if args.cpu_smoke else "nccl"
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.cpu_smoke:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise Missing("no CUDA GPU visible (--cpu-smoke runs on the CPU)")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    if args.cpu_smoke:  # torchtitan takes "cuda" where no accelerator is found: name the CPU
        for module in titan.cpu_device_modules:
            module.device_type = "cpu"
    started = time.perf_counter()
    pd = titan.ParallelDims(
        dp_replicate=1, dp_shard=1, cp=1, tp=world, pp=1, ep=1, etp=1, world_size=world
    )
    pd.build_mesh()
    jc = job_config(titan, args, world)
    titan.dist_utils.set_determinism(pd, device, jc.debug, distinct_seed_mesh_dims=[])
    symm_mem = False
    if jc.parallelism.enable_async_tensor_parallel:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        with warnings.catch_warnings():  # deprecated in 2.11, yet its pass still needs it
            warnings.simplefilter("ignore", FutureWarning)
            enable_symm_mem_for_group(pd.get_mesh("tp").get_group().group_name)
        symm_mem = True
    fusions = FusionCounter()
    model, model_args = build_model(torch, titan, args, jc, pd, device)
    optimizers = titan.build_optimizers([model], jc.optimizer, pd)
    loss_fn = titan.build_cross_entropy_loss(jc)
    train_context = titan.dist_utils.get_train_context(
        pd.tp_enabled and not jc.parallelism.disable_loss_parallel
    )
    pool = token_pool(torch, args, model_args.vocab_size, device)
    tokens = args.batch * args.seq
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses, step_s = [], []
    for step in range(args.steps):
        inputs, labels = batch_at(pool, step, args.batch)
        sync()
        t0 = time.perf_counter()
        optimizers.zero_grad()
        with train_context():
            pred = model(inputs)
            loss = loss_fn(pred, labels) / tokens
            del pred
            loss.backward()
        titan.dist_utils.clip_grad_norm_(
            [p for p in model.parameters()], max_norm=1.0, foreach=True
        )
        optimizers.step()
        full = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        losses.append(float(full.detach()))
        sync()
        step_s.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step:3d} loss {losses[-1]:.5f} {step_s[-1] * 1e3:9.1f} ms", flush=True)
    timed = step_s[args.warmup :]
    record = dict(
        config=dict(
            tp=world,
            switch=args.switch,
            layers=args.layers,
            steps=args.steps,
            seq=args.seq,
            batch=args.batch,
            warmup=args.warmup,
            pool=args.pool,
            seed=args.seed,
            lr=args.lr,
            dtype=args.dtype,
            cpu_smoke=args.cpu_smoke,
            flavor=SMOKE_FLAVOR if args.cpu_smoke else FLAVOR,
            dim=model_args.dim,
            n_heads=model_args.n_heads,
            n_kv_heads=model_args.n_kv_heads,
            vocab_size=model_args.vocab_size,
            async_tp=jc.parallelism.enable_async_tensor_parallel,
            compile=jc.compile.enable,
            symm_mem_enabled_for_tp_group=symm_mem,
            automatic_dynamic=args.automatic_dynamic,
        ),
        dynamo_stats=dict(torch._dynamo.utils.counters["stats"]),
        tokens_per_step=tokens,
        tokens_per_s=tokens * len(timed) / sum(timed),
        step_ms=[round(s * 1e3, 3) for s in step_s],
        losses=losses,
        fusions_inserted=fusions.counts,
        routing_stats=routing_record(),
        versions=versions(torch, titan),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        argv=sys.argv,
        seconds=round(time.perf_counter() - started, 1),
    )
    dist.destroy_process_group()
    return record if rank == 0 else {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_env_agrees(args.switch, dict(os.environ))
        record = train(args)
    except Missing as ex:
        print(f"titan_async_tp: {ex}", file=sys.stderr)
        return MISSING_EXIT
    if record:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"tokens/s {record['tokens_per_s']:.1f} -> {args.out}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
