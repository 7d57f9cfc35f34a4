"""Vela 2: the decoder scorer model library (usable with no queue).

Light at import time: `vela2.schemas`, `vela2.errors` and `vela2.config` need no torch, so the
producer can use them. `load`, `predict`, `init_demo` and `system_one_request` import the model
stack on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": ("vela2.checkpoint", "load"),
    "save": ("vela2.checkpoint", "save"),
    "predict": ("vela2.reference", "predict"),
    "init_demo": ("vela2.demo", "init_demo"),
    "system_one_request": ("vela2.systemone", "system_one_request"),
    "Vela2Model": ("vela2.modeling", "Vela2Model"),
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name in {"pipeline", "rendering", "modeling", "checkpoint", "calibration", "spans", "demo"}:
        import importlib

        return importlib.import_module(f"vela2.{name}")
    raise AttributeError(f"module 'vela2' has no attribute {name!r}")
