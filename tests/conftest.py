"""Shared fixtures: plugins loaded once, and third-party plugin wheels built on the fly.

With ``-n auto`` (pytest-xdist, the README's command) each worker runs torch on its share of
the cores, so that workers do not fight over them.

Hugging Face's caches live in a directory of this run, set before anything imports
transformers (which reads them once): loading a checkpoint with ``trust_remote_code`` copies
its module into ``HF_MODULES_CACHE``, never into the user's. ``HF_HUB_OFFLINE``: nothing is
fetched from the Hub.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

_HF_HOME = tempfile.mkdtemp(prefix="fxsym-tests-hf-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
os.environ.update(HF_HOME=_HF_HOME, HF_MODULES_CACHE=os.path.join(_HF_HOME, "modules"),
                  HF_HUB_OFFLINE="1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fxsym  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from plugin_wheels import build_wheel, pip_install_target  # noqa: E402

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, torch.get_num_threads() // _WORKERS))


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
