"""Build a small plugin distribution as a wheel and pip-install it, for plugin tests."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out: Path, dist: str, version: str, modules: dict[str, str],
                entry_points: dict[str, str]) -> Path:
    """A pure-Python wheel holding ``modules`` (path -> source) and ``fxsym`` entry points."""
    out.mkdir(parents=True, exist_ok=True)
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    files: dict[str, bytes] = {path: src.encode() for path, src in modules.items()}
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n").encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: fxsym-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    eps = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    files[f"{info}/entry_points.txt"] = f"[fxsym]\n{eps}".encode()
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def pip_install_target(wheel: Path, target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        check=True, capture_output=True, text=True,
    )
