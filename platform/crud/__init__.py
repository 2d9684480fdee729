"""Database operations on the registry, one module per resource."""

from loraplex.platform.crud.adapters import (
    AdapterRef,
    UsableModel,
    create_grant,
    delete_adapter,
    delete_grant,
    read_adapter,
    read_adapters,
    read_usable_models,
    register_adapter,
    resolve_model,
)
from loraplex.platform.crud.api_keys import create_api_key, read_api_keys, revoke_api_key
from loraplex.platform.crud.tenants import (
    create_tenant,
    delete_tenant,
    read_tenant,
    read_tenant_by_name,
    read_tenants,
    update_tenant,
)
from loraplex.platform.crud.usage import insert_usage, read_usage

__all__ = [
    "AdapterRef",
    "UsableModel",
    "create_api_key",
    "create_grant",
    "create_tenant",
    "delete_adapter",
    "delete_grant",
    "delete_tenant",
    "insert_usage",
    "read_adapter",
    "read_adapters",
    "read_api_keys",
    "read_tenant",
    "read_tenant_by_name",
    "read_tenants",
    "read_usable_models",
    "read_usage",
    "register_adapter",
    "resolve_model",
    "revoke_api_key",
    "update_tenant",
]
