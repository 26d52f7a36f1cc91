"""Reading cosyvoice3.yaml: the sizes of the three models and the streaming constants.

The official file is a HyperPyYAML document (``!new:``, ``!ref``, ``!name:`` tags). We only need
its numbers, so a permissive PyYAML loader keeps every tagged node as plain data and ``<name>``
references are resolved against the top-level keys.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SPEECH_TOKEN_SIZE = 6561  # FSQ codebook: ids >= this are control tokens (sos, eos, task, fill)


class _TaggedLoader(yaml.SafeLoader):
    pass


def _construct_tagged(loader: yaml.Loader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    value = loader.construct_scalar(node)
    return {"__ref__": value} if suffix == "ref" else value


_TaggedLoader.add_multi_constructor("!", _construct_tagged)

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(expr: str) -> Any:
    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported expression in cosyvoice3.yaml: {expr!r}")

    return walk(ast.parse(expr, mode="eval"))


def _resolve(value: Any, top: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__ref__"}:
            expr = re.sub(r"<([\w.]+)>", lambda m: repr(_resolve(top[m.group(1)], top)), value["__ref__"])
            try:
                return _arith(expr)
            except (ValueError, SyntaxError):
                return expr  # a reference we do not need (paths, functions)
        return {k: _resolve(v, top) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, top) for v in value]
    return value


def read_yaml(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        raw = yaml.load(f, Loader=_TaggedLoader)
    return _resolve(raw, raw)


@dataclass
class FlowConfig:
    vocab_size: int = SPEECH_TOKEN_SIZE
    mel_bins: int = 80
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    cfg_rate: float = 0.7
    n_timesteps: int = 10
    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    static_chunk_size: int = 50  # mel frames: chunk_size tokens x token_mel_ratio


@dataclass
class HiftConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: list[int] = field(default_factory=lambda: [8, 5, 3])
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 11, 7])
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    source_resblock_kernel_sizes: list[int] = field(default_factory=lambda: [7, 7, 11])
    source_resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    conv_pre_look_right: int = 4
    f0_cond_channels: int = 512

    @property
    def samples_per_frame(self) -> int:
        return int(self.hop_len * _prod(self.upsample_rates))


@dataclass
class LLMConfig:
    speech_token_size: int = SPEECH_TOKEN_SIZE
    hidden_size: int = 896
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0
    # FSQ codes of silence and breath (the reference's CosyVoice3 model): past max_silent_run in a
    # row they are dropped before the flow, so a long pause does not become long silence
    silent_tokens: frozenset[int] = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
    max_silent_run: int = 5

    @property
    def sos(self) -> int:
        return self.speech_token_size

    @property
    def eos(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        return self.speech_token_size + 2


@dataclass
class CosyVoice3Config:
    sample_rate: int = 24000
    token_frame_rate: int = 25
    chunk_size: int = 25  # tokens per flow chunk (the DiT's static chunk, in tokens)
    llm: LLMConfig = field(default_factory=LLMConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiftConfig = field(default_factory=HiftConfig)


def _prod(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def load_config(checkpoint_dir: str | Path) -> CosyVoice3Config:
    """Build the config from ``<dir>/cosyvoice3.yaml`` (the official HyperPyYAML layout)."""
    doc = read_yaml(Path(checkpoint_dir) / "cosyvoice3.yaml")
    llm, flow, hift = doc["llm"], doc["flow"], doc["hift"]
    sampling = llm.get("sampling") or {}
    pre, cfm = flow["pre_lookahead_layer"], flow["decoder"]
    est, cfm_params = cfm["estimator"], cfm["cfm_params"]
    cfm_params = cfm_params.get("content", cfm_params)
    f0 = hift["f0_predictor"]
    return CosyVoice3Config(
        sample_rate=int(doc["sample_rate"]),
        token_frame_rate=int(doc["token_frame_rate"]),
        chunk_size=int(doc["chunk_size"]),
        llm=LLMConfig(
            speech_token_size=int(llm["speech_token_size"]),
            hidden_size=int(llm["llm_input_size"]),
            top_p=float(sampling.get("top_p", 0.8)),
            top_k=int(sampling.get("top_k", 25)),
            win_size=int(sampling.get("win_size", 10)),
            tau_r=float(sampling.get("tau_r", 0.1)),
        ),
        flow=FlowConfig(
            vocab_size=int(flow["vocab_size"]),
            mel_bins=int(flow["output_size"]),
            spk_embed_dim=int(flow["spk_embed_dim"]),
            token_mel_ratio=int(flow["token_mel_ratio"]),
            pre_lookahead_len=int(flow["pre_lookahead_len"]),
            pre_lookahead_channels=int(pre["channels"]),
            cfg_rate=float(cfm_params.get("inference_cfg_rate", 0.7)),
            dim=int(est["dim"]),
            depth=int(est["depth"]),
            heads=int(est["heads"]),
            dim_head=int(est["dim_head"]),
            ff_mult=int(est["ff_mult"]),
            static_chunk_size=int(est["static_chunk_size"]),
        ),
        hift=HiftConfig(
            in_channels=int(hift["in_channels"]),
            base_channels=int(hift["base_channels"]),
            nb_harmonics=int(hift["nb_harmonics"]),
            sampling_rate=int(hift["sampling_rate"]),
            nsf_alpha=float(hift["nsf_alpha"]),
            nsf_sigma=float(hift["nsf_sigma"]),
            nsf_voiced_threshold=float(hift["nsf_voiced_threshold"]),
            upsample_rates=[int(v) for v in hift["upsample_rates"]],
            upsample_kernel_sizes=[int(v) for v in hift["upsample_kernel_sizes"]],
            n_fft=int(hift["istft_params"]["n_fft"]),
            hop_len=int(hift["istft_params"]["hop_len"]),
            resblock_kernel_sizes=[int(v) for v in hift["resblock_kernel_sizes"]],
            resblock_dilation_sizes=[[int(d) for d in ds] for ds in hift["resblock_dilation_sizes"]],
            source_resblock_kernel_sizes=[int(v) for v in hift["source_resblock_kernel_sizes"]],
            source_resblock_dilation_sizes=[
                [int(d) for d in ds] for ds in hift["source_resblock_dilation_sizes"]
            ],
            lrelu_slope=float(hift["lrelu_slope"]),
            audio_limit=float(hift["audio_limit"]),
            conv_pre_look_right=int(hift["conv_pre_look_right"]),
            f0_cond_channels=int(f0["cond_channels"]),
        ),
    )
