"""The repo's folders must never shadow standard-library or PyPI top-level names."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
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


def test_tests_never_import_conftest_by_bare_name():
    # `import conftest` resolves to whichever conftest.py pytest put on sys.path first: the
    # collection order would decide which one. Shared helpers live in importable modules.
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*(from\s+conftest\s+import|import\s+conftest\b)", line)
    ]
    assert not offenders, offenders


def test_every_setting_is_documented():
    """Every Settings field and every LORAPLEX_* variable the code reads is in docs/api.md's
    settings table (the test-only ones in the README)."""
    from loraplex.platform.settings import Settings

    settings_doc = (ROOT / "docs" / "api.md").read_text().split("## Settings", 1)[1]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", settings_doc.split("\n## ", 1)[0]))
    missing = {name.upper() for name in Settings.model_fields} - documented
    assert not missing, f"docs/api.md's settings table lacks {sorted(missing)}"
    readme = (ROOT / "README.md").read_text()
    read = {
        name
        for top in ("engine", "kernels", "platform", "tests")
        for path in (ROOT / top).rglob("*.py")
        for name in re.findall(r"LORAPLEX_([A-Z0-9_]+)", path.read_text())
    }
    undocumented = {n for n in read - documented if f"LORAPLEX_{n}" not in readme}
    assert not undocumented, sorted(undocumented)


def test_the_licence_is_an_spdx_expression():
    # A licence table or `License ::` classifiers make setuptools print a deprecation warning at
    # every `make setup`.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pyproject["license"] == "Apache-2.0"
    assert not [c for c in pyproject.get("classifiers", []) if c.startswith("License ::")]
