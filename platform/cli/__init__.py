"""The `loraplex` command line."""

from loraplex.platform.cli.main import main

__all__ = ["main"]
