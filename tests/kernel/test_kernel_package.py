"""CI compiles every kernel that Frost itself defines (anywhere in the package) to an sm_90 cubin with NVRTC."""
import importlib
import pkgutil

import pytest

import frost
from frost.kernel import Kernel


def _modules():
    names = []
    for info in pkgutil.walk_packages(frost.__path__, "frost."):
        if not info.name.startswith("frost.kernel"):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module", _modules())
def test_every_kernel_in_the_package_compiles_for_sm90(module):
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # an optional dependency (e.g. CuPy) that this machine lacks
        pytest.skip(f"{module}: {exc}")
    kernels = [v for v in vars(mod).values() if isinstance(v, Kernel) and v.fn.__module__ == module]
    for k in kernels:
        if all(n in k.defaults for n in k.const_names()):
            assert k.compile("sm_90")[:4] == b"\x7fELF", k
