"""Tiny random transformers checkpoints (saved with save_pretrained) for parity tests."""

import pytest

from tests.helpers.hf_models import ARCHS, one_torch_thread, save_hf_models  # noqa: F401 - autouse fixture


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """arch -> (transformers model, checkpoint dir)."""
    return save_hf_models(tmp_path_factory.mktemp("hf"), {arch: {"arch": arch} for arch in ARCHS})
