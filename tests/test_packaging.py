"""The wheel carries what an installed server needs beside its modules: Alembic's scripts (so
`loraplex db upgrade` works outside a checkout) and the admin console's files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What setup.py packs (a copy: building in the checkout would leave build/lib behind).
SOURCES = ("setup.py", "pyproject.toml", "README.md", "engine", "kernels", "platform",
           "admin-ui", "migrations")  # fmt: skip


def test_the_wheel_ships_migrations_and_the_console_and_db_upgrade_runs_from_it(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dist), str(source)], check=True)
    (wheel,) = dist.glob("loraplex-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "loraplex/migrations/env.py",
        "loraplex/migrations/script.py.mako",
        "loraplex/migrations/versions/0001_initial.py",
        "loraplex/admin_ui/index.html",
        "loraplex/admin_ui/src/main.js",
    } <= names
    assert not any(name.startswith("loraplex/admin_ui/screenshots/") for name in names)

    installed = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(installed), str(wheel)], check=True
    )
    database = tmp_path / "registry.db"
    code = (
        "from loraplex.platform.db import migrate; "
        f"migrate.upgrade('sqlite:///{database}'); print(migrate.MIGRATIONS_DIR)"
    )
    # The installed copy comes first on the path (the checkout's editable install is after it).
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.strip() == str(installed / "loraplex" / "migrations")
    assert database.stat().st_size > 0
