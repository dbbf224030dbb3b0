import pytest


@pytest.fixture
def needs_mpi():
    pytest.importorskip("mpi4py")
