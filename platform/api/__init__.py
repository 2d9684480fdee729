"""The HTTP layer: routes, dependencies, error mapping, middleware."""

from loraplex.platform.api.docs import install_docs
from loraplex.platform.api.errors import install_error_handlers
from loraplex.platform.api.main import api_router
from loraplex.platform.api.middleware import RequestContextMiddleware, RequestIdLogFilter
from loraplex.platform.api.openapi import install_openapi

__all__ = [
    "RequestContextMiddleware",
    "RequestIdLogFilter",
    "api_router",
    "install_docs",
    "install_error_handlers",
    "install_openapi",
]
