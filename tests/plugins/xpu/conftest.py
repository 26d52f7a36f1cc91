import pytest

pytest.importorskip("omni_xpu")
