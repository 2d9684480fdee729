"""Database operations on the registry, one module per resource."""

from loraplex.platform.crud.adapter_names import (
    AdapterRef,
    UsableModel,
    read_usable_models,
    resolve_model,
)
from loraplex.platform.crud.adapters import (
    AdapterValidator,
    check_adapter_name,
    delete_adapter,
    read_adapter,
    read_adapters,
    read_latest_ready_ids,
    register_adapter,
    register_staged,
    remove_unused_files,
    set_adapter_status,
)
from loraplex.platform.crud.api_keys import create_api_key, read_api_keys, revoke_api_key
from loraplex.platform.crud.audit import AuditFilter, insert_audit_event, read_audit_events
from loraplex.platform.crud.grants import create_grant, delete_grant
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
    "AdapterValidator",
    "AuditFilter",
    "UsableModel",
    "check_adapter_name",
    "create_api_key",
    "create_grant",
    "create_tenant",
    "delete_adapter",
    "delete_grant",
    "delete_tenant",
    "insert_audit_event",
    "insert_usage",
    "read_adapter",
    "read_adapters",
    "read_api_keys",
    "read_audit_events",
    "read_latest_ready_ids",
    "read_tenant",
    "read_tenant_by_name",
    "read_tenants",
    "read_usable_models",
    "read_usage",
    "register_adapter",
    "register_staged",
    "remove_unused_files",
    "resolve_model",
    "revoke_api_key",
    "set_adapter_status",
    "update_tenant",
]
