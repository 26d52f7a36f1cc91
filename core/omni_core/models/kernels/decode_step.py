"""A batch-1 decode forward of a Qwen2-style dense decoder in one persistent CUDA kernel.

At one sequence a decode step is a chain of small dependent kernels (about six a layer on the
fused Triton path), and the step's time is their boundaries more than the weight bytes they read:
each kernel's weight stream starts only when the kernel is scheduled. ``decode_step.cu`` runs the
whole forward (every layer, the final norm) as one kernel with one block per multiprocessor and
grid-wide barriers between a layer's phases; each block owns a fixed slice of every weight and
requests it phases ahead (the MLP's slices by bulk copy into shared memory, q/k/v and o_proj
rows, like the attention's cached K/V, by L2 prefetch), so the weight stream runs under the
barriers. Numerics follow the fused Triton path.

It applies to bf16 dense models without per-head q/k norms (Qwen2-style; not Qwen3, not MoE) on
Hopper GPUs, with head size 64, hidden and q sizes multiples of 128 and an intermediate size a
multiple of 256, where NVRTC and the driver library load, and only with
``OMNI_DECODE_STEP_KERNEL=1``: on the H200 it is still slower than the per-layer kernels
(docs/experiments/2026-12-03-one-kernel-decode-step.md). The model calls it for decode steps of one
sequence on the fused path (``QwenForCausalLM.forward``); everything else keeps the per-layer
kernels.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_core.models.kernels import DECODE_STEP_ENV, cuda_rtc, decode_step_enabled
from omni_core.models.kernels.launch import multiprocessors

log = logging.getLogger(__name__)

THREADS = 256  # 8 warps: up to 255 registers a thread (at 384 threads, 168, and spills that stalled on pending loads)
ATT_WARPS = 8  # warps of a block that read K/V in the attention phase
MAX_SPLITS = 8  # attention spans per KV head at most (every block combines them all)
MAX_QKV_ROWS_PER_WARP = 2  # q/k/v rows a warp holds in registers in the first phase
TOKENS_PER_ITEM = 128  # fewest tokens one block's attention span takes (a multiple of 16)
PHASES_PER_LAYER = 5  # decode_step.cu's PHASE_END points a layer
MARKS_PER_LAYER = 8  # and its PHASE_MARK points (recorded with ``profile``)
SOURCE = Path(__file__).with_name("decode_step.cu")


@dataclass(frozen=True)
class StepShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    kv_block: int
    has_bias: bool

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def layout(self, blocks: int) -> dict[str, int]:
        """Shared-memory bytes of the kernel on ``blocks`` blocks: the MLP slices, then the scratch."""
        rows_inter = -(-self.inter // blocks)
        rows_hidden = -(-self.hidden // blocks)
        x_bytes = 2 * rows_inter * self.hidden * 2
        y_bytes = rows_hidden * self.inter * 2
        warps = THREADS // 32
        qkv_rows = 2 * -(-(self.heads + 2 * self.kv_heads) * self.head_dim // 2 // blocks)  # a block's q/k/v rows at most
        a_rows = -(-qkv_rows // warps)
        red = -(-(a_rows * warps) // 4) * 4
        scratch = max(self.hidden, self.heads * self.head_dim) + red + self.group * self.head_dim
        scratch += 2 * ATT_WARPS * self.group + max(ATT_WARPS * self.group * self.head_dim, self.inter // 2)  # merge space; the activation in E
        return {"X_BYTES": x_bytes, "Y_BYTES": y_bytes, "A_ROWS": a_rows, "shared": 128 + x_bytes + y_bytes + 4 * scratch}

    def unsupported(self, blocks: int, shared_limit: int) -> str | None:
        q_size = self.heads * self.head_dim
        warps = THREADS // 32
        if self.head_dim != 64:
            return f"head size {self.head_dim} (the kernel takes 64)"
        if self.hidden % 128 or q_size % 128 or self.inter % 256 or self.heads % self.kv_heads:
            return f"hidden {self.hidden}, q size {q_size}, intermediate {self.inter}: need multiples of 128, 128, 256"
        layout = self.layout(blocks)
        if -(-self.hidden // blocks) > warps or layout["A_ROWS"] > MAX_QKV_ROWS_PER_WARP or self.kv_heads * MAX_SPLITS > blocks:
            return f"{blocks} multiprocessors are too few for hidden {self.hidden}"
        if self.group > 16 or 2 * self.kv_heads * MAX_SPLITS > ATT_WARPS * self.head_dim:
            return f"{self.group} query heads a KV head"
        shared = layout["shared"]
        if shared > shared_limit:
            return f"needs {shared} bytes of shared memory a block, the device has {shared_limit}"
        return None


class _Params(ctypes.Structure):  # mirrors ``struct Params`` in decode_step.cu
    _fields_ = [
        ("layers", ctypes.c_void_p), ("final_norm", ctypes.c_void_p), ("embeds", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p), ("cache_layer_stride", ctypes.c_longlong),
        ("block_table", ctypes.c_void_p), ("context_lens", ctypes.c_void_p), ("positions", ctypes.c_void_p), ("slots", ctypes.c_void_p),
        ("cos_table", ctypes.c_void_p), ("sin_table", ctypes.c_void_p),
        ("resid", ctypes.c_void_p), ("q", ctypes.c_void_p), ("part_ml", ctypes.c_void_p), ("part_acc", ctypes.c_void_p),
        ("act", ctypes.c_void_p), ("barrier", ctypes.c_void_p),
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("tokens_per_item", ctypes.c_int), ("profile", ctypes.c_void_p),
    ]


@functools.cache
def _compiled(shape: StepShape, blocks: int, arch: str, profile: bool) -> bytes:
    layout = shape.layout(blocks)
    defines = {
        "HIDDEN": shape.hidden, "HEADS": shape.heads, "KV_HEADS": shape.kv_heads, "HEAD_DIM": shape.head_dim, "INTER": shape.inter,
        "LAYERS": shape.layers, "KV_BLOCK": shape.kv_block, "HAS_BIAS": int(shape.has_bias), "THREADS": THREADS,
        "ATT_WARPS": ATT_WARPS, "MAX_SPLITS": MAX_SPLITS, "X_BYTES": layout["X_BYTES"], "Y_BYTES": layout["Y_BYTES"],
        "A_ROWS": layout["A_ROWS"], "PROFILE": int(profile),
        "PHASES_PER_LAYER": PHASES_PER_LAYER, "MARKS_PER_LAYER": MARKS_PER_LAYER,
    }
    return cuda_rtc.compile_kernel(SOURCE, defines, arch)


class DecodeStepKernel:
    """The one-kernel decode forward of ``model`` (a ``QwenForCausalLM``) over the engine's caches.
    Build with ``DecodeStepKernel.build`` (None where it does not apply)."""

    def __init__(self, model, kv_caches, shape: StepShape, device: torch.device, blocks: int, profile: bool = False):
        self.shape = shape
        self.blocks = blocks
        layout = shape.layout(blocks)
        cubin = _compiled(shape, blocks, cuda_rtc.device_arch(device), profile)
        self.kernel = cuda_rtc.CudaKernel(cubin, "decode_step", device, layout["shared"])
        # with ``profile``: when each phase of each layer ended on block 0, the points inside
        # phases, then when each block arrived at each barrier, in ns of the GPU's global timer
        marks = shape.layers * (PHASES_PER_LAYER + MARKS_PER_LAYER + PHASES_PER_LAYER * blocks)
        self.phase_ends = torch.zeros(marks, dtype=torch.int64, device=device) if profile else None
        if self.kernel.blocks_per_multiprocessor(THREADS) < 1:
            raise cuda_rtc.CudaRtcError("the kernel does not fit on a multiprocessor")
        inner = model.model
        table = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            bias = attn.qkv_proj.bias
            table.append([
                layer.input_layernorm.weight.data_ptr(), attn.qkv_proj.weight.data_ptr(), bias.data_ptr() if bias is not None else 0,
                attn.o_proj.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(), mlp.gate_up_proj.weight.data_ptr(),
                mlp.down_proj.weight.data_ptr(),
            ])
        self.weights = torch.tensor(table, dtype=torch.int64, device=device)  # LayerWeights[] on the device
        self.final_norm = inner.norm.weight
        self.eps = float(inner.norm.eps)
        self.cos = inner.rotary.cos.float().contiguous()
        self.sin = inner.rotary.sin.float().contiguous()
        self.k_cache, self.v_cache = kv_caches[0]
        self.cache_stride = (kv_caches[1][0].data_ptr() - kv_caches[0][0].data_ptr()) // kv_caches[0][0].element_size() if len(kv_caches) > 1 else 0
        f32 = dict(dtype=torch.float32, device=device)
        self.resid = torch.zeros(shape.hidden, **f32)
        self.q = torch.zeros(shape.heads * shape.head_dim, **f32)
        self.part_ml = torch.zeros(shape.kv_heads * MAX_SPLITS * shape.group * 2, **f32)
        self.part_acc = torch.zeros(shape.kv_heads * MAX_SPLITS * shape.group * shape.head_dim, **f32)
        self.act = torch.zeros(shape.inter, dtype=torch.bfloat16, device=device)
        self.barrier = torch.zeros(1, dtype=torch.int32, device=device)

    @classmethod
    def build(cls, model, kv_caches, block_size: int, device: torch.device) -> DecodeStepKernel | None:
        device = _indexed(device)
        reason = cls.unsupported_reason(model, kv_caches, block_size, device)
        if reason is None:
            shape = _shape(model, block_size)
            try:
                return cls(model, kv_caches, shape, device, multiprocessors(device))
            except cuda_rtc.CudaRtcError as exc:
                reason = str(exc)
        log.info("batch-1 decode keeps the per-layer kernels: %s", reason)
        return None

    @staticmethod
    def unsupported_reason(model, kv_caches, block_size: int, device: torch.device) -> str | None:
        if not decode_step_enabled():
            return f"{DECODE_STEP_ENV} is not 1"
        device = _indexed(device)
        if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
            return "the kernel is built for Hopper GPUs"
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None or getattr(model, "qk_norm", True) or getattr(model, "moe", True):
            return "not a dense decoder without q/k norms"
        for layer in layers:
            if not hasattr(layer.mlp, "gate_up_proj"):
                return "a layer without the gated MLP"
        params = [p for p in model.parameters()] + [kv_caches[0][0]]
        if any(p.dtype != torch.bfloat16 or p.device != device for p in params):
            return "weights and caches must be bf16 on the device"
        k0 = kv_caches[0][0]
        if k0.dim() != 3 or not k0.is_contiguous() or any(v.stride() != k0.stride() for kv in kv_caches for v in kv):
            return "caches must be [slots, kv_heads, head_dim], contiguous, one layout"
        if len(kv_caches) > 1:
            stride = kv_caches[1][0].data_ptr() - kv_caches[0][0].data_ptr()
            if any(kv_caches[i][j].data_ptr() - kv_caches[0][j].data_ptr() != i * stride for i in range(len(kv_caches)) for j in (0, 1)):
                return "the layers' caches must be evenly spaced"
        shape = _shape(model, block_size)
        limit = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
        return shape.unsupported(multiprocessors(device), limit)

    def __call__(self, embeds: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """The final-normed hidden state [1, hidden] of one decode token (``embeds`` [1, hidden])."""
        shape = self.shape
        out = torch.empty(1, shape.hidden, dtype=torch.bfloat16, device=embeds.device)
        embeds = embeds.contiguous()
        params = _Params(
            self.weights.data_ptr(), self.final_norm.data_ptr(), embeds.data_ptr(), out.data_ptr(),
            self.k_cache.data_ptr(), self.v_cache.data_ptr(), self.cache_stride,
            meta.block_tables.data_ptr(), meta.context_lens.data_ptr(), positions.data_ptr(), meta.slot_mapping.data_ptr(),
            self.cos.data_ptr(), self.sin.data_ptr(),
            self.resid.data_ptr(), self.q.data_ptr(), self.part_ml.data_ptr(), self.part_acc.data_ptr(),
            self.act.data_ptr(), self.barrier.data_ptr(),
            self.eps, shape.head_dim**-0.5, TOKENS_PER_ITEM,
            self.phase_ends.data_ptr() if self.phase_ends is not None else None,
        )
        self.kernel.launch(self.blocks, THREADS, params, cooperative=True)  # the grid barriers need every block resident
        return out


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as ``cuda:<current>``, as tensors report their device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _shape(model, block_size: int) -> StepShape:
    layer = model.model.layers[0]
    attn = layer.self_attn
    return StepShape(
        hidden=model.config.hidden_size, heads=attn.num_heads, kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
        inter=layer.mlp.down_proj.in_features, layers=len(model.model.layers), kv_block=block_size,
        has_bias=attn.qkv_proj.bias is not None,
    )
