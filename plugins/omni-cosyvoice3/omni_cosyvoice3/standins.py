"""Small random stand-ins for the two ONNX models of a checkpoint, exported with torch.onnx.

They keep the official input/output signatures, so the frontend runs them through onnxruntime
exactly as it runs the real files:
- speech_tokenizer_v3.onnx: (feats [1, 128, T] float32, feats_length [1] int32) -> tokens [1, T // 4]
  int64 in [0, 6561): a strided conv and 8-dimensional 3-level finite scalar quantisation.
- campplus.onnx: (fbank [1, T, 80] float32) -> embedding [1, 192] float32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

FSQ_DIMS, FSQ_LEVELS = 8, 3  # 3 ** 8 = 6561 speech tokens


class TinySpeechTokenizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv1d(128, FSQ_DIMS, kernel_size=4, stride=4)
        self.register_buffer("place", FSQ_LEVELS ** torch.arange(FSQ_DIMS))

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(self.proj(feats))  # [1, 8, T // 4]
        digits = torch.round(z + 1.0).clamp(0, FSQ_LEVELS - 1).to(torch.int64)
        tokens = (digits * self.place[None, :, None]).sum(dim=1)
        # the real model masks frames past feats_length; here every frame is valid
        return tokens * (feats_length[:1] > 0).to(torch.int64)[:, None]


class TinySpeakerEncoder(nn.Module):
    def __init__(self, dim: int = 192):
        super().__init__()
        self.frame = nn.Linear(80, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, fbank: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.frame(fbank)).mean(dim=1))


def export_standins(directory: str | Path, seed: int = 0) -> None:
    directory = Path(directory)
    torch.manual_seed(seed)
    tokenizer = TinySpeechTokenizer().eval()
    torch.onnx.export(
        tokenizer,
        (torch.randn(1, 128, 400), torch.tensor([400], dtype=torch.int32)),
        str(directory / "speech_tokenizer_v3.onnx"),
        input_names=["feats", "feats_length"],
        output_names=["indices"],
        dynamic_axes={"feats": {2: "frames"}, "indices": {1: "tokens"}},
        dynamo=False,
    )
    speaker = TinySpeakerEncoder().eval()
    torch.onnx.export(
        speaker,
        (torch.randn(1, 300, 80),),
        str(directory / "campplus.onnx"),
        input_names=["input"],
        output_names=["embedding"],
        dynamic_axes={"input": {1: "frames"}},
        dynamo=False,
    )
