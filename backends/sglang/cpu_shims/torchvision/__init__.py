"""Import shim for SGLang 0.5.23 on CPU (see ../README.md); this is not torchvision.

SGLang's model-config modules (and transformers' image utilities) import torchvision names at
start-up for vision models a text server never builds; PyPI's torchvision is a CUDA build that
fails to load on a CPU torch. Here every ``torchvision`` module and name resolves to a placeholder:
imports succeed, any use raises ``NotImplementedError`` naming the shim.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class Placeholder:
    """Stands for any torchvision name; attributes are placeholders too, calls raise."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "Placeholder":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name}: fastpp's CPU import shim stands in for torchvision, which a text model "
            "served by SGLang on CPU does not need; install a CPU build of torchvision for vision models"
        )

    def __repr__(self) -> str:
        return f"<torchvision shim {self._name}>"


def _module_getattr(module_name: str):
    def getattr_(name: str) -> Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{module_name}.{name}")

    return getattr_


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``torchvision.<anything>`` as a placeholder module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        return None


__version__ = "0.0.0+fastpp.cpu.shim"
__getattr__ = _module_getattr("torchvision")
if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
