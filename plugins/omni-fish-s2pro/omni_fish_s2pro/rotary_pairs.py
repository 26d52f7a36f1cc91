"""S2-Pro rotates q and k by interleaved pairs (dimensions 2i and 2i+1 turn together, the
GPT-J / complex-number form); the core's rotary turns halves (i with i + d/2, the NeoX form).
Both turn pair i by the same angle, so reordering each head's rows of the q and k projections
(and of the q/k norms) from (0, 1, 2, 3, ...) to (0, 2, 4, ..., 1, 3, 5, ...) makes the halves
form compute exactly what the interleaved one does: the attention scores are dot products of q
and k, which the same reordering of both leaves unchanged. Values and outputs are untouched."""

from __future__ import annotations

import torch


def halves_order(head_dim: int) -> torch.Tensor:
    """Row ``j`` of a reordered head is row ``order[j]`` of the interleaved one."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def reorder_heads(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``rows`` [heads * head_dim, ...] (a q or k projection, or its bias) in the halves order."""
    shape = rows.shape
    heads = rows.reshape(shape[0] // head_dim, head_dim, *shape[1:])
    return heads[:, halves_order(head_dim)].reshape(shape)


def fused_qkv_to_halves(wqkv: torch.Tensor, n_head: int, n_kv: int, head_dim: int) -> torch.Tensor:
    """A fused q|k|v projection (weight or bias) with its q and k rows in the halves order."""
    q, k, v = wqkv.split([n_head * head_dim, n_kv * head_dim, n_kv * head_dim])
    return torch.cat([reorder_heads(q, head_dim), reorder_heads(k, head_dim), v])


def norm_to_halves(weight: torch.Tensor) -> torch.Tensor:
    """A per-head q or k norm's weight [head_dim] in the halves order."""
    return weight[halves_order(weight.shape[0])]


def fused_qkv_to_interleaved(wqkv: torch.Tensor, n_head: int, n_kv: int, head_dim: int) -> torch.Tensor:
    """The inverse of ``fused_qkv_to_halves`` (writing a checkpoint in the file's order)."""
    back = torch.argsort(halves_order(head_dim))
    q, k, v = wqkv.split([n_head * head_dim, n_kv * head_dim, n_kv * head_dim])

    def undo(rows: torch.Tensor) -> torch.Tensor:
        return rows.reshape(rows.shape[0] // head_dim, head_dim, *rows.shape[1:])[:, back].reshape(rows.shape)

    return torch.cat([undo(q), undo(k), v])
