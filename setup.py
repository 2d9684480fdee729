"""Maps the top-level folders onto the `loraplex` package (see docs/architecture.md).

engine/ -> loraplex.engine, kernels/ -> loraplex.kernels, platform/ -> loraplex.platform, and
admin-ui/ (the console's static files, no Python) -> the data package loraplex.admin_ui, and
migrations/ (Alembic's scripts) -> loraplex.migrations.
Sub-packages are discovered, so a new folder needs no edit here. `make setup` installs the
project in setuptools' strict editable mode: a tree of links under build/ that mypy, pytest and
editors resolve like any installed package (a new module needs `make setup` again, which the
Makefile's stamp does by itself).
"""

from setuptools import find_namespace_packages, setup

TOP_LEVEL = ("engine", "kernels", "platform")

packages = []
package_dir = {}
for top in TOP_LEVEL:
    for name in [top, *(f"{top}.{sub}" for sub in find_namespace_packages(top))]:
        if "__pycache__" in name:
            continue
        packages.append(f"loraplex.{name}")
        package_dir[f"loraplex.{name}"] = name.replace(".", "/")

# py.typed (PEP 561): type checkers read the installed package's own annotations.
package_data = {f"loraplex.{top}": ["py.typed"] for top in TOP_LEVEL}
# The API docs pages' vendored scripts, styles and their licences (platform/api/docs.py).
for assets in ("swagger_ui", "redoc"):
    package_data[f"loraplex.platform.api.docs_assets.{assets}"] = ["*"]
package_data["loraplex.platform.api.docs_assets"] = ["README.md"]

# Data-only folders shipped in the wheel. Each folder is declared as a package of its own with
# the files it ships (setuptools warns about folders it finds but nobody declared).
DATA_TREES = {
    # The admin console, served at /admin (its screenshots and test-only files stay in the repo).
    "loraplex.admin_ui": (
        "admin-ui",
        {"": ["*.html", "*.css"], "src": ["*.js"], "src/pages": ["*.js"], "vendor": ["*"]},
    ),
    # Alembic's scripts, so that `loraplex db upgrade` works from an installed wheel.
    "loraplex.migrations": ("migrations", {"": ["*.py", "*.mako"], "versions": ["*.py"]}),
}
for package, (folder, files) in DATA_TREES.items():
    for sub, patterns in files.items():
        name = ".".join([package, *sub.split("/")]) if sub else package
        packages.append(name)
        package_dir[name] = f"{folder}/{sub}" if sub else folder
        package_data[name] = patterns

setup(packages=packages, package_dir=package_dir, package_data=package_data)
