from __future__ import annotations

import pytest

from tests.core.serve.server import install_testfamily


@pytest.fixture(scope="session")
def testfamily_site(tmp_path_factory):
    """The test family installed as a real distribution (its entry point found via dist-info)."""
    return install_testfamily(tmp_path_factory.mktemp("testfamily-site"))
