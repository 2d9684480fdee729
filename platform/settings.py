"""Service settings: the only place the platform reads environment variables (prefix LORAPLEX_).

Everything has an embedded default (a SQLite file under `data_dir`, no Redis, the CPU), so
`loraplex serve --demo` works on a bare machine. `data_dir` is the user's data directory
(`$XDG_DATA_HOME/loraplex`, else `~/.local/share/loraplex`), the same wherever a command runs.
Secrets left unset are generated once, by the server or `loraplex db upgrade`, and persisted
under `data_dir` with mode 0600 (fine for the embedded default, logged as a warning); the other
commands refuse to work without them rather than mint new ones the server would not accept.
"""

from __future__ import annotations

import logging
import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

logger = logging.getLogger(__name__)

JWTAlgorithm = Literal["HS256", "RS256"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def default_data_dir() -> Path:
    """The user's data directory for Loraplex: independent of the working directory."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "loraplex"


def default_cache_dir() -> Path:
    """Where rebuildable files go (the converted demo model)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loraplex"


class MissingSecretError(RuntimeError):
    """A command needs a secret that only the server (or `loraplex db upgrade`) creates."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LORAPLEX_", extra="ignore")

    # Storage
    data_dir: Path = Field(default_factory=default_data_dir)
    cache_dir: Path = Field(default_factory=default_cache_dir)  # the converted demo model
    database_url: str | None = None  # default: sqlite file data_dir/loraplex.db
    redis_url: str | None = None  # unset: the in-process rate limiter
    redis_key_prefix: str = "loraplex:"
    adapter_dir: Path | None = None  # default: data_dir/adapters
    # An adapter upload (the whole multipart body, or an archive's expanded files): 413 beyond.
    max_adapter_bytes: int = Field(default=1 << 30, ge=1024)

    # Secrets and tokens
    jwt_secret: SecretStr | None = None  # HS256 key; generated + persisted when unset
    api_key_secret: SecretStr | None = None  # HMAC key for API key hashes; same treatment
    jwt_algorithm: JWTAlgorithm = "HS256"
    jwt_public_key_file: Path | None = None  # RS256: verifies tokens
    jwt_private_key_file: Path | None = None  # RS256: issues tokens (optional on verifiers)
    jwt_audience: str = "loraplex"
    jwt_issuer: str = "loraplex"
    jwt_leeway_s: int = Field(default=10, ge=0, le=300)
    tenant_token_ttl_s: int = Field(default=900, ge=1)
    admin_token_ttl_s: int = Field(default=3600, ge=1)
    max_token_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)
    # How long a successful credential or model look-up is reused without reading the registry
    # (0: never). Changes made through this server apply at once; changes made by another process
    # (the CLI, another server) apply within this many seconds (platform/registry_cache.py).
    registry_cache_ttl_s: float = Field(default=5.0, ge=0, le=300)

    # Engine
    model: str | None = None  # a Hugging Face checkpoint directory
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    # None: the checkpoint's own quantization_config, if any (docs/quantization.md).
    quantization: Literal["fp8", "awq", "gptq"] | None = None
    # GPUs the model is sharded over (docs/tensor_parallel.md).
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_model_len: int | None = None
    # None: the engine's default for the device (512 on CUDA, 256 on the CPU).
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_loras: int | None = None  # distinct adapters in one step; None: no cap
    max_lora_rank: int = 64
    # The engine's step loop in a process of its own (its Python work never competes with the
    # event loop); False: a thread of the server's process.
    engine_process: bool = True
    engine_args: dict[str, Any] = Field(default_factory=dict)  # any other LLM(...) keyword

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    public_metrics: bool = False  # /metrics without an admin token (labels name tenants)

    # Request caps (DoS through parameters)
    max_prompt_tokens: int | None = None  # default: max_model_len - 1
    max_completion_tokens: int = Field(default=4096, ge=1)
    # Tokens per choice held against tokens-per-minute at admission when a request leaves out
    # max_tokens; what it generates beyond them is charged as it streams.
    reserved_completion_tokens: int = Field(default=256, ge=1)
    max_messages: int = Field(default=1024, ge=1)

    # Backpressure: beyond these engine queue depths new requests get 429 engine_overloaded.
    max_waiting_requests: int = Field(default=256, ge=1)
    max_waiting_tokens: int = Field(default=1 << 20, ge=1)

    # Default limits for tenants created without explicit ones.
    default_requests_per_minute: int = Field(default=600, ge=1)
    default_tokens_per_minute: int = Field(default=1_000_000, ge=1)
    default_max_concurrent_requests: int = Field(default=32, ge=1)

    # Lifecycle
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    usage_flush_interval_s: float = Field(default=1.0, gt=0)
    usage_batch_size: int = Field(default=500, ge=1)
    usage_max_pending: int = Field(default=100_000, ge=1)
    log_level: LogLevel = "INFO"

    @field_validator("database_url", "redis_url", "model")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'loraplex.db').resolve()}"

    @property
    def resolved_adapter_dir(self) -> Path:
        return (self.adapter_dir or self.data_dir / "adapters").resolve()

    def jwt_signing_key(self) -> str:
        """The key that signs tokens: the HS256 secret or the RS256 private key (PEM)."""
        return self._jwt_key(self.jwt_private_key_file, "LORAPLEX_JWT_PRIVATE_KEY_FILE", "issue")

    def jwt_verification_key(self) -> str:
        """The key that verifies tokens: the HS256 secret or the RS256 public key (PEM)."""
        return self._jwt_key(self.jwt_public_key_file, "LORAPLEX_JWT_PUBLIC_KEY_FILE", "verify")

    def _jwt_key(self, rs256_file: Path | None, variable: str, use: str) -> str:
        if self.jwt_algorithm == "HS256":
            return self.hs256_secret()
        if rs256_file is None:
            raise RuntimeError(f"{variable} is needed to {use} RS256 tokens")
        return rs256_file.read_text()

    def hs256_secret(self, *, create: bool = True) -> str:
        """The HS256 key: LORAPLEX_JWT_SECRET, else the one in data_dir (generated there when
        `create`; MissingSecretError otherwise)."""
        if self.jwt_secret is None:
            self.jwt_secret = SecretStr(self._persisted("jwt_secret", create))
        return self.jwt_secret.get_secret_value()

    def api_key_hash_secret(self, *, create: bool = True) -> bytes:
        """The HMAC key of API key hashes, as `hs256_secret` finds or makes it."""
        if self.api_key_secret is None:
            self.api_key_secret = SecretStr(self._persisted("api_key_secret", create))
        return self.api_key_secret.get_secret_value().encode()

    def _persisted(self, name: str, create: bool) -> str:
        path = self.data_dir / name
        if not create and not path.exists():
            raise MissingSecretError(
                f"no {name} in {self.data_dir} (LORAPLEX_DATA_DIR), so nothing made now would "
                "match the server's: run this with the server's data directory, set "
                f"LORAPLEX_{name.upper()}, or create it with `loraplex db upgrade` (or by "
                "starting the server) first"
            )
        return _persisted_secret(path)

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `AsyncEngine.from_engine_args` (as `LLM(...)` takes them)."""
        kwargs: dict[str, Any] = {
            "device": self.device,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank,
            "engine_process": self.engine_process,
        }
        kwargs.update(self.engine_args)
        return kwargs


def _persisted_secret(path: Path) -> str:
    """Read a generated secret from `path`, creating it (mode 0600) on first use."""
    if path.exists():
        return path.read_text().strip()
    logger.warning(
        "no %s set: generated one and stored it in %s (set LORAPLEX_%s in production)",
        path.name,
        path,
        path.name.upper(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(48))
    try:
        os.link(tmp, path)  # atomic: a concurrent process either wins or reads the winner's
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process (the CLI's entry point)."""
    return Settings()
