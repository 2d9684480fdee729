"""Maps the top-level folders onto the `loraplex` package (see docs/architecture.md).

engine/ -> loraplex.engine, kernels/ -> loraplex.kernels, platform/ -> loraplex.platform, and
admin-ui/ (the console's static files, no Python) -> the data package loraplex.admin_ui.
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

# The admin console ships inside the wheel (served at /admin); its screenshots stay in the repo.
ADMIN_UI_FILES = ("*.html", "*.css", "src/*.js", "src/pages/*.js", "vendor/*")
packages.append("loraplex.admin_ui")
package_dir["loraplex.admin_ui"] = "admin-ui"
package_data["loraplex.admin_ui"] = list(ADMIN_UI_FILES)

setup(packages=packages, package_dir=package_dir, package_data=package_data)
