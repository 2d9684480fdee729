"""Settings: the LORAPLEX_ prefix, embedded defaults, generated secrets persisted once."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from loraplex.platform.cli.main import _parser
from loraplex.platform.cli.serve import _settings
from loraplex.platform.settings import Settings


def test_environment_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("LORAPLEX_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    data = tmp_path / "home" / ".local" / "share" / "loraplex"
    for cwd in (tmp_path, tmp_path / "home"):  # the same data wherever a command runs
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        s = Settings()
        assert s.resolved_database_url == f"sqlite:///{data / 'loraplex.db'}"
        assert s.redis_url is None and s.resolved_adapter_dir == data / "adapters"
        assert s.engine_kwargs()["max_num_seqs"] is None  # the engine's default for the device
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert Settings().data_dir == tmp_path / "xdg" / "loraplex"
    monkeypatch.setenv("LORAPLEX_DATA_DIR", str(tmp_path / "elsewhere"))
    assert Settings().data_dir == tmp_path / "elsewhere"
    monkeypatch.setenv("LORAPLEX_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("LORAPLEX_REDIS_URL", "")
    monkeypatch.setenv("LORAPLEX_MAX_NUM_SEQS", "4")
    monkeypatch.setenv("LORAPLEX_ENGINE_ARGS", '{"num_kv_blocks": 64}')
    s = Settings()
    assert s.resolved_database_url == "postgresql+psycopg://u@h/db" and s.redis_url is None
    assert s.engine_kwargs()["max_num_seqs"] == 4 and s.engine_kwargs()["num_kv_blocks"] == 64


def test_generated_secrets_are_persisted_privately(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    secret = s.hs256_secret()
    assert len(secret) >= 64
    path = tmp_path / "jwt_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Settings(data_dir=tmp_path).hs256_secret() == secret  # the same after a restart
    assert Settings(data_dir=tmp_path).api_key_hash_secret() != secret.encode()
    assert Settings(data_dir=tmp_path, jwt_secret="given").hs256_secret() == "given"


def test_log_level_is_one_of_logging_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPLEX_LOG_LEVEL", "debug")
    assert Settings().log_level == "DEBUG"
    monkeypatch.setenv("LORAPLEX_LOG_LEVEL", "verbose")
    with pytest.raises(ValidationError, match="log_level"):
        Settings()


def test_quantization_reaches_the_engine_from_env_and_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LORAPLEX_QUANTIZATION", raising=False)
    assert Settings(data_dir=tmp_path).engine_kwargs()["quantization"] is None
    monkeypatch.setenv("LORAPLEX_QUANTIZATION", "awq")
    assert Settings(data_dir=tmp_path).engine_kwargs()["quantization"] == "awq"
    args = _parser().parse_args(["serve", "--model", str(tmp_path), "--quantization", "fp8"])
    assert _settings(args).engine_kwargs()["quantization"] == "fp8"
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--quantization", "int8"])
    monkeypatch.setenv("LORAPLEX_QUANTIZATION", "int8")
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path)


def test_tensor_parallel_size_reaches_the_engine_from_env_and_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LORAPLEX_TENSOR_PARALLEL_SIZE", raising=False)
    assert Settings(data_dir=tmp_path).engine_kwargs()["tensor_parallel_size"] == 1
    monkeypatch.setenv("LORAPLEX_TENSOR_PARALLEL_SIZE", "4")
    assert Settings(data_dir=tmp_path).engine_kwargs()["tensor_parallel_size"] == 4
    args = _parser().parse_args(["serve", "--model", str(tmp_path), "--tensor-parallel-size", "2"])
    assert _settings(args).engine_kwargs()["tensor_parallel_size"] == 2
    monkeypatch.setenv("LORAPLEX_TENSOR_PARALLEL_SIZE", "0")
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path)
