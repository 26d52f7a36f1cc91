"""Machine code of the batch-1 decode kernels for Hopper, without a GPU: each fused projection
(``kernels/fused_linear.py``) of a Qwen2-0.5B decode step at one row, compiled with the engine's tiles by
Triton for sm_90a, specialized as a launch specializes it (16-byte aligned pointers, sizes and
strides divisible by 16, one row), then disassembled with the ``nvdisasm`` Triton ships.

For each: registers a thread, the global loads before and after the wait for the previous
kernel (``griddepcontrol.wait``, ``ACQBULK`` in the machine code), and the block-wide barriers
after it (each cross-warp reduction or layout change passes through shared memory). Everything that does not depend
on the previous kernel (weight tiles, norm weight, bias, rotary rows, slots) should be before it;
after it, only the previous kernel's outputs (x and the residual). Then the step's two attention
kernels at 1, 2 and 4 warps a program: registers, spills, instructions and block-wide barriers
(their cross-warp reductions).

    python benchmarks/decode_kernels_sass.py
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile

import triton
from omni_core.models.kernels import fused_linear as fl
from omni_core.models.kernels import paged_attention as pa
from triton.backends.compiler import GPUTarget

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 896, 4864, 14, 2, 64
QKV_PAIRS, QKV_WARPS = fl._qkv_tile(1)  # the engine's q/k/v tile at one row
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def projection(K: int, block_n: int, prologue: int, epilogue: int, bias: bool, runtime: dict[str, int], warps: int = 4) -> dict:
    block_k, main_k, tail_k = fl._k_tiles(K, fl._block_k(K))
    consts = dict(K=K, PROLOGUE=prologue, EPILOGUE=epilogue, HAS_BIAS=bias, BLOCK_M=1, BLOCK_N=block_n, BLOCK_K=block_k, MAIN_K=main_k,
                  TAIL_K=tail_k, HALF=HEAD_DIM // 2 if epilogue == fl.EPILOGUE_ROTARY_KV else 16,
                  ROPE_BY_POSITION=epilogue == fl.EPILOGUE_ROTARY_KV, PDL=True, EARLY_LAUNCH=True)
    return {"consts": consts, "runtime": {"M": 1, **runtime}, "warps": warps}


PROJECTIONS = {
    "norm + q/k/v + rotary + cache": projection(HIDDEN, QKV_PAIRS, fl.PROLOGUE_ADD_NORM, fl.EPILOGUE_ROTARY_KV, True, dict(
        n_cols=(HEADS + 2 * KV_HEADS) * HEAD_DIM, stride_xm=HIDDEN, stride_rm=HIDDEN, stride_rom=HIDDEN, stride_wn=HIDDEN, stride_om=HIDDEN,
        stride_rope=HEAD_DIM, stride_cache_slot=KV_HEADS * HEAD_DIM, stride_cache_head=HEAD_DIM, num_q_heads=HEADS, num_kv_heads=KV_HEADS),
        warps=QKV_WARPS),
    "o_proj": projection(HEADS * HEAD_DIM, fl.LINEAR_BLOCK_N, fl.PROLOGUE_NONE, fl.EPILOGUE_STORE, False, dict(
        n_cols=HIDDEN, stride_xm=HEADS * HEAD_DIM, stride_wn=HEADS * HEAD_DIM, stride_om=HIDDEN)),
    # 8 column pairs: what fused_linear._gate_up_block_n picks at one row on the H200
    "add + norm + gate/up + SiLU": projection(HIDDEN, 8, fl.PROLOGUE_ADD_NORM, fl.EPILOGUE_SILU_GATE, False, dict(
        n_cols=INTER, second_offset=INTER, stride_xm=HIDDEN, stride_rm=HIDDEN, stride_rom=HIDDEN, stride_wn=HIDDEN, stride_om=INTER)),
    "down_proj": projection(INTER, fl.LINEAR_BLOCK_N, fl.PROLOGUE_NONE, fl.EPILOGUE_STORE, False, dict(
        n_cols=HIDDEN, stride_xm=INTER, stride_wn=INTER, stride_om=HIDDEN)),
}


# the attention kernels of the same step: 16 splits of a 1024-token block table, 7 query heads a KV head
ATTENTION = {
    "paged decode attention (16 splits)": dict(
        fn=pa._paged_decode_kernel, floats=("scale",), pointers={"block_tables_ptr": "*i64", "context_lens_ptr": "*i64", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"},
        consts=dict(GROUP=HEADS // KV_HEADS, GROUP_PAD=16, HEAD_DIM=HEAD_DIM, DIM_PAD=HEAD_DIM, KV_BLOCK=16, BLOCK_N=64, SPLIT=True, PRECISION="tf32", PDL=True),
        runtime=dict(stride_qt=HEADS * HEAD_DIM, stride_qh=HEAD_DIM, stride_ot=HEADS * HEAD_DIM, stride_oh=HEAD_DIM, stride_cache_slot=KV_HEADS * HEAD_DIM,
                     stride_cache_head=HEAD_DIM, stride_table=64, partition_size=64, num_splits=16, num_heads=HEADS)),
    "combine of the splits": dict(
        fn=pa._combine_splits_kernel, floats=(), pointers={"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"},
        consts=dict(SPLITS_PAD=16, HEAD_DIM=HEAD_DIM, DIM_PAD=HEAD_DIM, PDL=True),
        runtime=dict(stride_ot=HEADS * HEAD_DIM, stride_oh=HEAD_DIM, num_splits=16, num_heads=HEADS)),
}


def compile_cubin(config: dict, fn=fl._skinny_linear_kernel, pointers=None, floats=("eps",), num_warps: int = 4) -> bytes:
    """``fn`` compiled for sm_90a, specialized as a launch with ``config``'s values specializes it."""
    pointers = pointers or {"pos_ptr": "*i64", "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
    names = list(inspect.signature(fn.fn).parameters)
    consts = dict(config["consts"])
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in consts:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            value = config["runtime"].get(name, 0)
            signature[name] = "fp32" if name in floats else "i32"
            if value == 1 and name not in floats:
                consts[name], signature[name] = 1, "constexpr"
            elif value and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "launch_pdl": True}).asm["cubin"]


def machine_code(cubin: bytes, tmp: str) -> tuple[str, str, list[str]]:
    """(registers a thread, spilled bytes a thread, instruction lines) of ``cubin``."""
    path = os.path.join(tmp, "k.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    usage = tool("cuobjdump", "--dump-resource-usage", path)
    code = [line for line in tool("nvdisasm", "-c", path).splitlines() if line.strip().startswith("/*")]
    return re.search(r"REG:(\d+)", usage).group(1), re.search(r"STACK:(\d+)", usage).group(1), code


def tool(name: str, *args: str) -> str:
    return subprocess.run([os.path.join(TOOLS, name), *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    print("| projection | warps | registers | loads before the wait | loads after it | block-wide barriers after it |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in PROJECTIONS.items():
            registers, _, code = machine_code(compile_cubin(config, num_warps=config["warps"]), tmp)
            wait = next(i for i, line in enumerate(code) if "ACQBULK" in line)
            loads = [(i, re.search(r"LDG\.E(\.\w+)*", line).group(0)) for i, line in enumerate(code) if "LDG" in line]

            def summary(part):
                kinds: dict[str, int] = {}
                for _, kind in part:
                    kinds[kind] = kinds.get(kind, 0) + 1
                return ", ".join(f"{n} {k}" for k, n in kinds.items()) or "none"

            barriers = sum("BAR.SYNC" in line for line in code[wait:])
            print(f"| {name} | {config['warps']} | {registers} | {summary([x for x in loads if x[0] < wait])} | {summary([x for x in loads if x[0] > wait])} | {barriers} |")
        print("\n| attention kernel | warps | registers | spilled bytes | instructions | block-wide barriers |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, spec in ATTENTION.items():
            for warps in (1, 2, 4):
                registers, stack, code = machine_code(compile_cubin(spec, spec["fn"], spec["pointers"], spec["floats"], warps), tmp)
                barriers = sum("BAR.SYNC" in line for line in code)
                print(f"| {name} | {warps} | {registers} | {stack} | {len(code)} | {barriers} |")


if __name__ == "__main__":
    main()
