"""The ``tiny`` preset: Qwen3-Omni's real architecture (thinker with its audio and vision
encoders, talker, code predictor, code2wav) at tiny sizes with deterministic random weights,
written in the official layout: config.json, sharded safetensors with their index (experts
stored per expert), generation_config.json, preprocessor_config.json, a chat template and a
small byte-level tokenizer of its own carrying Qwen3-Omni's special tokens. Its replies are
random tokens: it exercises the runtime, not understanding.

The ``full`` preset: the same files at Qwen3-Omni-30B-A3B's sizes, except the weights: 70 GB
of random safetensors would be written and read for nothing, so ``random_weights.json`` stands
in their place and each stage draws its weights on its own device as it loads (serving and
benchmarks at the real sizes, on a GPU). Its tokenizer has the real vocabulary's size (filler
words past the bytes), so every id the thinker samples decodes to text.

``write_tiny(dir, special_order=...)`` can place the special tokens elsewhere in the vocabulary:
a checkpoint whose ids are not the usual ones (the tests run it to show no id is hard-coded).
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import RANDOM_WEIGHTS, quiet_transformers

MARKER = ".omni-preset"
PRESET_REVISION = " (revision 4)"  # bumped when the preset's configs change: an older copy is rewritten
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
    "<think>", "</think>",
]
ROLE_WORDS = ["system", "user", "assistant"]
VOCAB_SIZE = 320  # the model's rows: the tokenizer's 275 and spare ones, as real checkpoints pad theirs

# ChatML with one placeholder per media part; the preprocessor expands each pad token to as many
# as the part's encoder gives rows. A system prompt is optional, as in Qwen3-Omni's own template.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

SIZES = {
    "thinker": dict(
        audio_config=dict(
            num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
            output_dim=64, downsample_hidden_size=8, n_window=50, n_window_infer=200, max_source_positions=1500,
        ),
        vision_config=dict(
            depth=3, hidden_size=32, num_heads=4, intermediate_size=64, patch_size=16, temporal_patch_size=2,
            spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0, 1],
        ),
        text_config=dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            norm_topk_prob=True, max_position_embeddings=4096, initializer_range=0.08,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "interleaved": True},
        ),
        position_id_per_seconds=13,
    ),
    "talker": dict(
        text_config=dict(
            # as the real one: the codebook's codes, then 1024 specials (codec ids at the real offsets)
            vocab_size=32 + 1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2], "interleaved": True},
        ),
        code_predictor_config=dict(
            vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, num_code_groups=4,
        ),
        num_code_groups=4, accept_hidden_layer=1, spatial_merge_size=2, position_id_per_seconds=13,
        codec_pad_id=132, codec_bos_id=133, codec_eos_token_id=134, codec_nothink_id=139, codec_think_bos_id=140,
        codec_think_eos_id=141, speaker_id={"chelsie": 285, "ethan": 286, "aiden": 287},
    ),
    "code2wav": dict(
        codebook_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=64, num_quantizers=4, decoder_dim=32, sliding_window=8,
    ),
}


# Qwen3-Omni-30B-A3B's sizes, as its config.json gives them (the `full` preset)
FULL_VOCAB_SIZE, FULL_REGULAR_TOKENS = 152064, 151643
FULL_SIZES = {
    "thinker": dict(
        audio_config=dict(
            num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, d_model=1280,
            output_dim=2048, downsample_hidden_size=480, n_window=50, n_window_infer=800, max_source_positions=1500,
            conv_chunksize=500,
        ),
        vision_config=dict(
            depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, patch_size=16, temporal_patch_size=2,
            spatial_merge_size=2, out_hidden_size=2048, num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
        ),
        text_config=dict(
            hidden_size=2048, intermediate_size=768, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
            head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
            max_position_embeddings=65536, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20], "interleaved": True},
        ),
        position_id_per_seconds=13,
    ),
    "talker": dict(
        text_config=dict(
            vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20, num_attention_heads=16,
            num_key_value_heads=2, head_dim=128, num_experts=128, num_experts_per_tok=6, moe_intermediate_size=384,
            shared_expert_intermediate_size=768, norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20], "interleaved": True},
        ),
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, num_code_groups=16, rms_norm_eps=1e-6,
        ),
        num_code_groups=16, accept_hidden_layer=24, spatial_merge_size=2, position_id_per_seconds=13,
        codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155, codec_think_bos_id=2156,
        codec_think_eos_id=2157, speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303},
    ),
    "code2wav": dict(
        codebook_size=2048, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
        intermediate_size=3072, num_quantizers=16, decoder_dim=1536, sliding_window=72, upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
    ),
}


def tiny_tokenizer(special_order: list[str] | None = None, regular_tokens: int = 0):
    """A byte-level BPE over the 256 byte symbols (no merges: a character is one to four
    tokens) with the special tokens; ``special_order`` puts them at other ids. With
    ``regular_tokens``, filler words (" w300", ...) pad the regular vocabulary to that size before
    the special tokens: encoding never makes them, decoding turns any id into text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = list(special_order or SPECIAL_TOKENS)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # a reordered checkpoint puts the special tokens first, so no id is where the usual one is
    first = special_order is not None
    vocab = {tok: i for i, tok in enumerate(specials)} if first else {}
    vocab.update({ch: len(vocab) + i for i, ch in enumerate(alphabet)})
    vocab.update({f"\u0120w{i}": i for i in range(len(vocab), regular_tokens)})  # \u0120: the byte-level space
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    # the role words are single tokens, as in Qwen's vocabulary (the talker finds turns by them)
    tok.add_tokens(ROLE_WORDS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )


def _config(vocab: dict[str, int], sizes: dict | None = None, parts: dict = SIZES, vocab_size: int = VOCAB_SIZE):
    from transformers import Qwen3OmniMoeConfig

    thinker = json.loads(json.dumps(parts["thinker"]))
    thinker["text_config"]["vocab_size"] = vocab_size
    for part, values in (sizes or {}).items():  # larger random checkpoints (benchmarks)
        thinker[part].update(values)
    ids = {
        "audio_token_id": "<|audio_pad|>", "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
        "audio_start_token_id": "<|audio_start|>", "audio_end_token_id": "<|audio_end|>",
        "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
    }
    thinker.update({key: vocab[token] for key, token in ids.items()})
    talker = json.loads(json.dumps(parts["talker"]))
    talker.update({key: thinker[key] for key in ids if key in thinker}, thinker_hidden_size=thinker["text_config"]["hidden_size"])
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=parts["code2wav"],
        enable_audio_output=True,
        im_start_token_id=vocab["<|im_start|>"],
        im_end_token_id=vocab["<|im_end|>"],
        tts_pad_token_id=vocab["<tts_pad>"],
        tts_bos_token_id=vocab["<tts_text_bos>"],
        tts_eos_token_id=vocab["<tts_text_eod>"],
        system_token_id=vocab["system"], user_token_id=vocab["user"], assistant_token_id=vocab["assistant"],
    )


def write_tiny(directory: str | Path, seed: int = 0, special_order: list[str] | None = None, shard_kb: int = 256,
               sizes: dict | None = None) -> str:
    """Write the preset into ``directory`` (skipped when a finished copy is already there).
    ``sizes`` overrides parts of the thinker's configs ({"text_config": {...}, "audio_config":
    {...}}): a larger random checkpoint of the same layout, for benchmarks."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    directory = Path(directory)
    marker = directory / MARKER
    name = "tiny" if special_order is None else "tiny-reordered"
    if sizes:
        name = "random:" + json.dumps(sizes, sort_keys=True)
    name += PRESET_REVISION
    if marker.exists() and marker.read_text() == name:
        return str(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(special_order)
    vocab = tokenizer.get_vocab()
    with quiet_transformers():
        config = _config(vocab, sizes)
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(config).eval()
        _init_left_empty(model, config, seed)
        _audible(model, seed)
        # several shards, as the real checkpoint has: stages read only the shards of their prefix
        model.save_pretrained(directory, max_shard_size=f"{shard_kb}KB")
    _write_files(directory, tokenizer, name, max_pixels=200704)  # small images for a tiny model: at most 196 visual tokens
    return str(directory)


def write_in_memory(directory: str | Path, parts: dict = FULL_SIZES, vocab_size: int = FULL_VOCAB_SIZE,
                    regular_tokens: int = FULL_REGULAR_TOKENS, name: str = "full") -> str:
    """A checkpoint of ``parts``' sizes whose weights are drawn at load (``random_weights.json``
    instead of safetensors): the ``full`` preset by default."""
    directory = Path(directory)
    name += " (random weights in memory)" + PRESET_REVISION
    if (directory / MARKER).exists() and (directory / MARKER).read_text() == name:
        return str(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(regular_tokens=regular_tokens)
    with quiet_transformers():
        _config(tokenizer.get_vocab(), parts=parts, vocab_size=vocab_size).save_pretrained(directory)
    for stale in directory.glob("*.safetensors*"):
        stale.unlink()
    (directory / RANDOM_WEIGHTS).write_text(json.dumps({"std": 0.02}), encoding="utf-8")
    _write_files(directory, tokenizer, name, max_pixels=12_845_056)
    return str(directory)


def _write_files(directory: Path, tokenizer, name: str, max_pixels: int) -> None:
    """What every preset writes beside the weights; the marker last (a finished copy)."""
    from transformers import GenerationConfig

    vocab = tokenizer.get_vocab()
    eos = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    GenerationConfig(eos_token_id=eos, pad_token_id=vocab["<|endoftext|>"]).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2), encoding="utf-8")
    for stray in ("chat_template.jinja",):  # the official layout keeps the template in chat_template.json
        (directory / stray).unlink(missing_ok=True)
    (directory / "preprocessor_config.json").write_text(json.dumps(_preprocessor_config(max_pixels), indent=2), encoding="utf-8")
    (directory / "README.md").write_text(
        f"omni-qwen3-omni `{name}` preset: the Qwen3-Omni layout with deterministic random weights. "
        "Its replies are random tokens.\n",
        encoding="utf-8",
    )
    (directory / MARKER).write_text(name)


def _init_left_empty(model, config, seed: int) -> None:
    """transformers' initialisation skips the talker's stacked experts (they keep whatever memory
    ``torch.empty`` gave, NaN at times): random normal weights like the rest, from the seed."""
    import torch

    std = config.talker_config.text_config.initializer_range
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("talker.model.") and ".mlp.experts." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def _audible(model, seed: int) -> None:
    """Random code2wav weights give a waveform of ~1e-7, silence once written as 16-bit samples:
    the last convolution is scaled so random codes peak near 0.5 (the speech stays noise, but
    audible noise, which differs between speakers and replies)."""
    import torch

    codes = torch.randint(0, model.config.code2wav_config.codebook_size, (1, model.config.code2wav_config.num_quantizers, 16),
                          generator=torch.Generator().manual_seed(seed))
    last = model.code2wav.decoder[-1].conv
    with torch.no_grad():
        peak = float(model.code2wav(codes).abs().max())
        if peak > 0:
            last.weight.mul_(0.5 / peak)
            last.bias.mul_(0.5 / peak)


def _preprocessor_config(max_pixels: int) -> dict:
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 4800000,
        "sampling_rate": 16000,
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 3136,
        "max_pixels": max_pixels,
        "processor_class": "Qwen3OmniMoeProcessor",
    }


def describe(directory: str | Path) -> str | None:
    marker = Path(directory) / MARKER
    return marker.read_text() if marker.exists() else None


if __name__ == "__main__":  # python -m omni_qwen3_omni.presets DIR
    import sys

    print(json.dumps({"path": write_tiny(sys.argv[1])}))
