"""The repo's folders must never shadow standard-library or PyPI top-level names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_stdlib_platform_is_not_shadowed_from_the_repo_root():
    # Running from the root puts it first on sys.path, as `python -m pytest` and scripts do.
    code = "import platform, sys; print(platform.__file__); platform.python_version()"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert not out.startswith(str(ROOT)), out
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_packages_import_under_the_loraplex_name():
    import loraplex.engine
    import loraplex.kernels

    # Installed in strict editable mode: the package's files are links to the repo's.
    assert Path(loraplex.engine.__file__).resolve().parent == ROOT / "engine"
    assert Path(loraplex.kernels.__file__).resolve().parent == ROOT / "kernels"


def test_the_engine_never_imports_the_platform():
    # The engine is a library of its own: demo code (platform/demo) and the service sit above it.
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "engine").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "loraplex.platform" in line
    ]
    assert not offenders, offenders
