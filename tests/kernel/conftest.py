"""Kernel tests compile into a private cache directory, never the user's."""
import pytest


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "frost-cache"))
