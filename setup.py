"""Maps the top-level folders onto the `loraplex` package (see docs/architecture.md).

engine/ -> loraplex.engine, kernels/ -> loraplex.kernels, platform/ -> loraplex.platform.
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

setup(packages=packages, package_dir=package_dir, package_data=package_data)
