"""A post-grad graph rewrite that lets torch's micro-pipeline TP pass fuse the all-gather of a
sequence-parallel shard with a leading batch of 1.

DTensor gathers a ``[1, S/TP, H]`` shard along the sequence as a dim-0 all-gather of the shard
(``[TP, S/TP, H]``) read through a reshape to ``[1, S, H]`` (funcol's ``_maybe_view_chunk_cat``),
then the linear layer reshapes that to ``[S, H]`` for its ``mm``. torch's pass fuses an all-gather
whose result feeds the matmul directly, through one reshape whose leading dims it keeps, or
through split + cat; a reshape to another leading shape is none of these, so at batch 1 it fuses
nothing. The rewrite gathers the shard flattened to 2-D instead (``[S/TP, H]`` -> ``[S, H]``): a
dim-0 all-gather concatenates the shards' elements in rank order whatever their shape, so every
reshape of the old result is the same reshape of the new one, and a reshape chain that ends at
``[S, H]`` becomes the new result itself, which the pass then sees feeding the ``mm``.

``compat.async_tp.install()`` registers ``rewrite`` as inductor's post-grad custom pre-pass
(before the pass runs), keeping any pass already there. The rewrite touches only an all-gather
whose shard has more than 2 dims and whose result is read by reshapes alone; it checks every
node before it changes any, so a graph it cannot rewrite stays as it was.
"""

from __future__ import annotations

import hashlib
import pathlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

aten = torch.ops.aten
# What the rewrite is, for inductor's graph cache: this file's contents.
_SOURCE_DIGEST = hashlib.sha256(pathlib.Path(__file__).read_bytes()).digest()


def _c10d():
    return torch.ops._c10d_functional


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _reshape_users_only(node: torch.fx.Node) -> bool:
    """Every user of ``node`` is a reshape, and every reshape reached through reshapes from it
    has its fake value (the shapes the rewrite compares)."""
    return bool(node.users) and all(
        u.target is aten.reshape.default and _all_reshapes_known(u) for u in node.users
    )


def _all_reshapes_known(node: torch.fx.Node) -> bool:
    if _val(node) is None:
        return False
    return all(_all_reshapes_known(u) for u in node.users if u.target is aten.reshape.default)


def _candidates(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(all-gather, its wait) pairs the rewrite applies to."""
    c10d = _c10d()
    out = []
    for ag in graph.nodes:
        if ag.target is not c10d.all_gather_into_tensor.default or len(ag.users) != 1:
            continue
        (wait,) = ag.users
        shard = ag.args[0]
        val = _val(shard)
        if wait.target is not c10d.wait_tensor.default or val is None or val.dim() <= 2:
            continue
        if getattr(val, "fake_mode", None) is None or _val(wait) is None:
            continue
        if not _reshape_users_only(wait):
            continue
        out.append((ag, wait))
    return out


def rewrite(graph: torch.fx.Graph) -> int:
    """Gather every eligible shard flattened to 2-D (see the module's docstring); the number of
    all-gathers rewritten."""
    c10d = _c10d()
    pairs = _candidates(graph)
    for ag, wait in pairs:
        shard, rest = ag.args[0], ag.args[1:]
        val, gathered = _val(shard), _val(wait)
        h = val.shape[-1]
        rows2d = [val.numel() // h, h]
        with val.fake_mode:
            flat_val = val.reshape(rows2d)
            new_val = gathered.new_empty((gathered.numel() // h, h))
        with graph.inserting_before(ag):
            flat = graph.call_function(aten.reshape.default, (shard, rows2d))
            flat.meta["val"] = flat_val
            new_ag = graph.call_function(c10d.all_gather_into_tensor.default, (flat, *rest))
            new_ag.meta["val"] = new_val
            new_wait = graph.call_function(c10d.wait_tensor.default, (new_ag,))
            new_wait.meta["val"] = new_val
        for user in list(wait.users):
            _rebase_reshape(user, new_wait)
        graph.erase_node(wait)
        graph.erase_node(ag)
    return len(pairs)


def _rebase_reshape(node: torch.fx.Node, source: torch.fx.Node) -> None:
    """``node`` (a reshape) reads ``source`` instead; the reshapes of ``node`` read ``source``
    too, and a reshape to ``source``'s own shape is replaced by ``source``."""
    node.args = (source, *node.args[1:])
    for user in list(node.users):
        if user.target is aten.reshape.default:
            _rebase_reshape(user, source)
    if tuple(_val(node).shape) == tuple(_val(source).shape):
        node.replace_all_uses_with(source)
    if not node.users:  # read by no one now (its readers read `source`)
        node.graph.erase_node(node)


class GatherRewritePass(CustomGraphPass):
    """``rewrite`` as inductor's post-grad custom pre-pass, then ``chained`` (the pass that was
    set before, or None). Its uuid names this file's contents and the chained pass's, so that
    inductor's graph cache tells rewritten graphs apart."""

    def __init__(self, chained=None):
        self.chained = chained

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite(graph)
        if self.chained is not None:
            self.chained(graph)

    def uuid(self):
        digest = hashlib.sha256(_SOURCE_DIGEST)
        chained_uuid = getattr(self.chained, "uuid", None)
        if chained_uuid is not None:
            digest.update(repr(chained_uuid()).encode())
        elif self.chained is not None:
            digest.update(repr(self.chained).encode())
        return digest.hexdigest()
