"""Sparse mixture-of-experts feed-forward: top-k routing, optional gated shared expert.

On CUDA (with triton) routing and experts run in the fused kernels of ``kernels.fused_moe``, with
no host sync (so inside decode graphs); elsewhere in torch, one matmul per expert that has tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.models import kernels
from omni_core.models.layers import GatedMLP


class Experts(nn.Module):
    """All experts' weights as two stacked tensors (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I])."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts = num_experts
        self.intermediate = intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.host_packed: tuple[torch.Tensor, torch.Tensor] | None = None  # pack_for_host

    def pack_for_host(self) -> None:
        """Keeps the float32 CPU weights only in the host kernel's panels (``native/moe.c``): one C
        call a layer runs every expert (the model's memory stays the same; its state_dict no
        longer holds the experts)."""
        from omni_core.models.native import moe as host_moe

        self.host_packed = host_moe.pack(self.gate_up_proj, self.down_proj)
        self.gate_up_proj = nn.Parameter(torch.empty(0), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, H]; expert_ids, weights [T, k]. Tokens are sorted by expert, so each expert runs
        one matmul over exactly the tokens routed to it (on the host kernel where packed)."""
        if self.host_packed is not None:
            from omni_core.models.native import moe as host_moe

            return host_moe.experts(x, expert_ids, weights, *self.host_packed, self.intermediate)
        T, k = expert_ids.shape
        flat = expert_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token_of = order // k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # one sync per layer
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = order[start : start + count]
            tokens = token_of[start : start + count]
            start += count
            gate, up = F.linear(x[tokens], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert])
            out.index_add_(0, tokens, y * weights.reshape(-1)[rows, None].to(y.dtype))
        return out


class SparseMoeBlock(nn.Module):
    """Router ``gate`` (softmax over experts in float32, top-k, optional renormalisation), the
    experts, and an optional ``shared_expert`` scaled by ``sigmoid(shared_expert_gate(x))``."""

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        intermediate: int,
        norm_topk_prob: bool,
        shared_intermediate: int = 0,
    ):
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, intermediate)
        if shared_intermediate:
            self.shared_expert = GatedMLP(hidden, shared_intermediate)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)
        else:
            self.shared_expert = None

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if x.is_cuda and kernels.triton_available():
            # routing and experts in a few kernels without a host sync (kernels.fused_moe): the
            # decode graphs capture them, and prefill runs no per-expert loop
            from omni_core.models.kernels import fused_moe

            expert_ids, weights = fused_moe.route(x, self.gate.weight, self.top_k, self.norm_topk_prob)
            out = fused_moe.experts_forward(x, self.experts.gate_up_proj, self.experts.down_proj, expert_ids, weights)
        else:
            logits = self.gate(x)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, expert_ids = torch.topk(probs, self.top_k, dim=-1)
            if self.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            out = self.experts(x, expert_ids, weights.to(x.dtype))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x, fused)
        return out
