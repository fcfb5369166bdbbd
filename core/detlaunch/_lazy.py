"""Attributes of a package that are imported on first use, so that importing the package costs almost nothing."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, namespace: dict[str, Any], exports: Mapping[str, str],
                    moved: Mapping[str, str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__``: `exports` maps each public name to its submodule;
    `moved`, names that were exported here and now live in that (public) submodule: still found,
    with a DeprecationWarning saying where they went."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None and moved and name in moved:
            module = moved[name]
            warnings.warn(f"{package}.{name} moved to {package}.{module}: import it from there",
                          DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(f".{module}", package), name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace.get("__all__", ()), *exports})

    return __getattr__, __dir__
