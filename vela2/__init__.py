"""Vela 2: the decoder scorer model library (usable with no queue).

Light at import time: `vela2.api.schemas`, `vela2.errors` and `vela2.config` need no torch, so the
producer can use them. `load`, `predict`, `init_demo` and `system_one_request` import the model
stack on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": ("vela2.model.checkpoint", "load"),
    "save": ("vela2.model.checkpoint", "save"),
    "predict": ("vela2.scoring.predict", "predict"),
    "init_demo": ("vela2.train.demo_model", "init_demo"),
    "system_one_request": ("vela2.scoring.systemone", "system_one_request"),
    "Vela2Model": ("vela2.model.modeling", "Vela2Model"),
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'vela2' has no attribute {name!r}")
