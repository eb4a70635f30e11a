"""Shared fixtures: plugins loaded once, and third-party plugin wheels built on the fly."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import fxsym

sys.path.insert(0, str(Path(__file__).parent))
from plugin_wheels import build_wheel, pip_install_target


@pytest.fixture(autouse=True, scope="session")
def _plugins() -> None:
    torch.manual_seed(0)
    fxsym.load_plugins()


@pytest.fixture
def install_plugin(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Build a plugin distribution as a wheel, pip-install it into a temp folder, rescan."""
    added: list[str] = []
    names: list[str] = []

    def install(dist: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
        wheel = build_wheel(tmp_path / "wheels", dist, "1.0", modules, entry_points)
        site = tmp_path / f"site-{dist}"
        pip_install_target(wheel, site)
        sys.path.insert(0, str(site))
        added.append(str(site))
        names.extend(entry_points)
        importlib.invalidate_caches()
        fxsym.load_plugins(rescan=True)
        return site

    yield install
    for site in added:
        sys.path.remove(site)
    pm = fxsym.load_plugins(rescan=True)
    for name in names:
        if pm.has_plugin(name):
            pm.unregister(name=name)
    for mod in [m for m in sys.modules if any(m.startswith(n) for n in ("fxsym_thirdparty",
                                                                        "fxsym_broken"))]:
        del sys.modules[mod]
