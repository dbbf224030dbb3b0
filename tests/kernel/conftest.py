"""Kernel tests compile into a private cache directory, never the user's; fake_cupy: a stand-in for CuPy's launches."""
import pytest

import fake_cupy as fake


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "frost-cache"))


@pytest.fixture
def fake_cupy(monkeypatch):
    """CuPy replaced by a recorder of module loads and launches (fake_cupy.py)."""
    return fake.install(monkeypatch)
