"""Random-weight checkpoints in the official directory layout.

``write_random_checkpoint(dir, "tiny")`` writes the real architecture at tiny sizes (the
``tiny`` preset: tests and demos; its audio is noise); ``"full"`` writes the real sizes with
random weights (benchmarks). Both produce cosyvoice3.yaml, llm.pt, flow.pt, hift.pt,
campplus.onnx, speech_tokenizer_v3.onnx, spk2info.pt and CosyVoice-BlankEN/ (Qwen2 config and
tokenizer), and are read back by the same loader as a downloaded checkpoint. Weights are
deterministic: the same preset always gives the same files' tensors.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from .config import FlowConfig, HiftConfig, LLMConfig
from .flow import FlowModel
from .hift import HiftGenerator
from .llm import EXTRA_TOKEN_ROWS
from .standins import export_standins
from .text_tokenizer import write_tiny_tokenizer

SIZES = {
    "tiny": {
        "qwen": dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=4096,
        ),
        "flow": dict(dim=64, depth=2, heads=2, dim_head=32, pre_lookahead_channels=64),
        "hift": dict(base_channels=32, f0_cond_channels=32),
    },
    "full": {
        "qwen": dict(
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            max_position_embeddings=32768,
            vocab_size=151936,
        ),
        "flow": dict(),
        "hift": dict(),
    },
}
MARKER = ".omni-preset"
PRESET_REVISION = " (revision 2)"  # bumped when the written files change: an older copy is rewritten

YAML_TEMPLATE = """# written by omni-cosyvoice3: the {preset} preset ({note})
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {pre_channels}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: {dit_dim_head}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {hift_base}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {f0_channels}
"""


def _write_yaml(directory: Path, preset: str, qwen: dict, flow: FlowConfig, hift: HiftConfig) -> None:
    text = YAML_TEMPLATE.format(
        preset=preset,
        note="deterministic random weights: its audio is noise",
        hidden=qwen["hidden_size"],
        pre_channels=flow.pre_lookahead_channels,
        dit_dim=flow.dim,
        dit_depth=flow.depth,
        dit_heads=flow.heads,
        dit_dim_head=flow.dim_head,
        hift_base=hift.base_channels,
        f0_channels=hift.f0_cond_channels,
    )
    (directory / "cosyvoice3.yaml").write_text(text, encoding="utf-8")


def _llm_state(backbone: Qwen2ForCausalLM, llm_cfg: LLMConfig) -> dict[str, torch.Tensor]:
    qwen_config = backbone.config
    state = {f"llm.model.{k}": v for k, v in backbone.state_dict().items()}  # the official llm.pt layout
    rows, hidden = llm_cfg.speech_token_size + EXTRA_TOKEN_ROWS, qwen_config.hidden_size
    state["speech_embedding.weight"] = torch.randn(rows, hidden) * 0.02
    state["llm_decoder.weight"] = torch.randn(rows, hidden) * 0.02
    return state


def write_random_checkpoint(directory: str | Path, preset: str = "tiny", seed: int = 0) -> str:
    """Write the preset into ``directory`` (skipped when a finished copy is already there)."""
    directory = Path(directory)
    marker = directory / MARKER
    if marker.exists() and marker.read_text() == preset + PRESET_REVISION:
        return str(directory)
    sizes = SIZES[preset]
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    blank = directory / "CosyVoice-BlankEN"
    blank.mkdir(exist_ok=True)
    vocab_size = write_tiny_tokenizer(blank)
    vocab_size = max(vocab_size, sizes["qwen"].get("vocab_size", 0))
    qwen = dict(
        sizes["qwen"],
        vocab_size=vocab_size,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    qwen_config = Qwen2Config(**qwen)
    _write_blank(blank, qwen_config)
    backbone = Qwen2ForCausalLM(qwen_config)  # Hugging Face names
    # the pretrained backbone the official code builds the llm from, before llm.pt replaces it
    save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, str(blank / "model.safetensors"), metadata={"format": "pt"})
    flow_cfg, hift_cfg, llm_cfg = FlowConfig(**sizes["flow"]), HiftConfig(**sizes["hift"]), LLMConfig()
    _write_yaml(directory, preset, qwen, flow_cfg, hift_cfg)
    torch.save(_llm_state(backbone, llm_cfg), directory / "llm.pt")
    torch.save(FlowModel(flow_cfg).state_dict(), directory / "flow.pt")
    # float32 on disk, as the official files (the F0 predictor runs in float64 once loaded)
    torch.save({k: v.float() for k, v in HiftGenerator(hift_cfg).state_dict().items()}, directory / "hift.pt")
    torch.save({"default": {"embedding": torch.randn(1, 192)}}, directory / "spk2info.pt")
    export_standins(directory, seed=seed)
    (directory / "README.md").write_text(
        f"omni-cosyvoice3 `{preset}` preset: the Fun-CosyVoice3 layout with deterministic random "
        "weights. Its audio is noise.\n",
        encoding="utf-8",
    )
    marker.write_text(preset + PRESET_REVISION)
    return str(directory)


def _write_blank(blank: Path, qwen_config: Qwen2Config) -> None:
    """CosyVoice-BlankEN/config.json with the rotary base under both names: transformers 5 reads
    ``rope_parameters``, transformers 4 (which the official code runs on) ``rope_theta``, and
    without it falls back to 10000."""
    qwen_config.save_pretrained(blank)
    path = blank / "config.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["rope_theta"] = (raw.get("rope_parameters") or {}).get("rope_theta", getattr(qwen_config, "rope_theta", None))
    path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def default_preset_dir(preset: str) -> Path:
    root = Path(os.environ.get("OMNI_PRESET_DIR") or Path(tempfile.gettempdir()) / "omni-presets")
    return root / f"cosyvoice3-{preset}"


def write_tiny(directory: str) -> str:
    """The ``tiny`` preset hook: FamilySpec.presets["tiny"]."""
    return write_random_checkpoint(directory, "tiny")


def describe(directory: str | Path) -> dict:
    marker = Path(directory) / MARKER
    return {"preset": marker.read_text() if marker.exists() else None}


if __name__ == "__main__":  # python -m omni_cosyvoice3.presets DIR [tiny|full]
    import sys

    print(
        json.dumps(
            {"path": write_random_checkpoint(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tiny")}
        )
    )
