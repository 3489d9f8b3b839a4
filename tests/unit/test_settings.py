"""Settings: a flag wins over its DEX_* variable, which wins over the config file, which
wins over the default; built in code, a settings object reads nothing from outside."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import dex.server.app
from dex.cli.main import app
from dex.server.config import ServerConfig
from dex.worker import WorkerConfig

CONFIG = """
[server]
listen = "0.0.0.0:8000"
heartbeat_timeout = 3
drain_timeout = 7
data_dir = "/from/file"

[worker]
capacity = 4
drain_timeout = 9
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "dex.toml"
    path.write_text(CONFIG)
    return path


def test_flags_over_variables_over_the_file_over_defaults(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEX_HEARTBEAT_TIMEOUT", "4")
    monkeypatch.setenv("DEX_SERVER_DRAIN_TIMEOUT", "8")
    monkeypatch.setenv("DEX_DRAIN_TIMEOUT", "99")  # the Worker's: not the server's
    config = ServerConfig.load(config_file, drain_timeout=2.5, data_dir=None)
    assert config.drain_timeout == 2.5  # flag
    assert config.heartbeat_timeout == 4  # variable
    assert (config.host, config.port) == ("0.0.0.0", 8000)  # file
    assert config.data_dir == Path("/from/file")  # file: the flag was not given
    assert config.reconnect_grace == 1.0  # default
    worker = WorkerConfig.load(config_file)
    assert (worker.capacity, worker.drain_timeout) == (4, 99)


def test_the_documented_variables_keep_working(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "DEX_DATA_DIR": "/d",
        "DEX_DATABASE": "sqlite:////x.db",
        "DEX_LISTEN": "10.1.2.3:7000",
        "DEX_HEARTBEAT_TIMEOUT": "12",
        "DEX_RECONNECT_GRACE": "2",
        "DEX_RECLAIM_WINDOW": "4.5",
        "DEX_SERVER_DRAIN_TIMEOUT": "30",
        "DEX_MAX_BODY_BYTES": "2048",
        "DEX_CLIENT_TOKEN": "c-secret",
        "DEX_WORKER_TOKEN": "w-secret",
        "DEX_ADMIN_TOKEN": "a-secret",
        "DEX_TRACING": "true",
        "DEX_STREAMS": "redis://r:6379/2",
        "DEX_WORKER_CAPACITY": "3",
        "DEX_DRAIN_TIMEOUT": "5",
        "DEX_ADDRESS": "http://a:1,http://b:2",
        "DEX_TOKENS_FILE": "/etc/dex/tokens.toml",
        "DEX_RATE_LIMIT": "20/second",
        "DEX_TLS_CERT": "/etc/dex/cert.pem",
        "DEX_TLS_KEY": "/etc/dex/key.pem",
        "DEX_STANDBY": "true",
        "DEX_PARTITIONS": "128",
        "DEX_ADVERTISE": "http://10.1.2.3:7000",
        "DEX_MODEL_LIMITS": '{"anthropic/claude-sonnet-4-5": {"concurrency": 8, "tpm": 400000}}',
        "DEX_TENANT_WEIGHTS": '{"acme": 3}',
        "DEX_PRICES": '{"gpt-4o": {"input": 2, "output": 8}}',
    }.items():
        monkeypatch.setenv(name, value)
    server = ServerConfig.load()
    assert server.model_dump() == {
        "data_dir": Path("/d"),
        "database": "sqlite:////x.db",
        "listen": "10.1.2.3:7000",
        "heartbeat_timeout": 12,
        "reconnect_grace": 2,
        "reclaim_window": 4.5,
        "drain_timeout": 30,
        "max_body_bytes": 2048,
        "max_wait_seconds": 60,
        "client_token": "c-secret",
        "worker_token": "w-secret",
        "admin_token": "a-secret",
        "streams": "redis://r:6379/2",
        "tracing": True,
        "tokens_file": Path("/etc/dex/tokens.toml"),
        "rate_limit": "20/second",
        "tls_cert": Path("/etc/dex/cert.pem"),
        "tls_key": Path("/etc/dex/key.pem"),
        "standby": True,
        "partitions": 128,
        "advertise": "http://10.1.2.3:7000",
        "model_limits": {
            "anthropic/claude-sonnet-4-5": {"concurrency": 8, "rpm": None, "tpm": 400000}
        },
        "tenant_weights": {"acme": 3.0},
        "prices": {"gpt-4o": {"input": 2.0, "output": 8.0}},
    }
    worker = WorkerConfig.load()
    assert (worker.capacity, worker.drain_timeout, worker.token) == (3, 5, "w-secret")
    assert worker.address == "http://a:1,http://b:2" and worker.tracing
    assert "secret" not in repr(worker) + repr(server)  # tokens stay out of logs


def test_built_in_code_it_reads_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEX_HEARTBEAT_TIMEOUT", "4")
    assert ServerConfig().heartbeat_timeout == 10.0
    assert ServerConfig(heartbeat_timeout=2).heartbeat_timeout == 2


def test_settings_are_frozen() -> None:
    config = ServerConfig()
    with pytest.raises(ValueError, match="frozen"):
        config.heartbeat_timeout = 1  # type: ignore[misc]


def test_the_command_line_passes_what_it_was_given(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[ServerConfig] = []
    monkeypatch.setattr(dex.server.app, "serve", served.append)
    monkeypatch.setenv("DEX_RECONNECT_GRACE", "0.5")
    runner = CliRunner()
    result = runner.invoke(app, ["server", "--config", str(config_file), "--listen", "1.2.3.4:5"])
    assert result.exit_code == 0, result.output
    (config,) = served
    assert (config.listen, config.reconnect_grace, config.drain_timeout) == ("1.2.3.4:5", 0.5, 7)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--listen", "nowhere"], "expected HOST:PORT"),
        (["--heartbeat-timeout", "0"], "greater than 0"),
        (["--config", "/no/such/dex.toml"], "no config file"),
    ],
)
def test_bad_settings_are_a_usage_error(
    args: list[str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dex.server.app, "serve", lambda config: None)
    monkeypatch.setenv("COLUMNS", "300")  # the error box on one line
    result = CliRunner().invoke(app, ["server", *args])
    assert result.exit_code == 2 and says in result.output


def test_an_unknown_setting_in_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dex.toml"
    path.write_text("[server]\nheartbeat_timout = 3\n")
    with pytest.raises(ValueError, match="heartbeat_timout"):
        ServerConfig.load(path)


def test_an_exporter_opentelemetry_does_not_know_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dex.server.app, "serve", lambda config: None)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-over-carrier-pigeon")
    monkeypatch.setenv("COLUMNS", "300")  # the error box on one line
    result = CliRunner().invoke(app, ["server", "--tracing"])
    assert result.exit_code == 2 and "choose otlp, console, none" in result.output


def test_model_limits_come_from_the_file_by_group(tmp_path: Path) -> None:
    path = tmp_path / "dex.toml"
    path.write_text(
        '[server.model_limits."openai/gpt-5"]\nconcurrency = 4\nrpm = 500\n\n'
        "[server.model_limits.team-a]\ntpm = 30000\n"
    )
    limits = ServerConfig.load(path).model_limits
    assert {g: limit.model_dump(exclude_none=True) for g, limit in limits.items()} == {
        "openai/gpt-5": {"concurrency": 4, "rpm": 500},
        "team-a": {"tpm": 30000},
    }
    path.write_text('[server.model_limits."openai/gpt-5"]\nconcurency = 4\n')
    with pytest.raises(ValueError, match="concurency"):
        ServerConfig.load(path)


def test_prices_come_from_the_config_file_over_the_shipped_ones(tmp_path: Path) -> None:
    path = tmp_path / "dex.toml"
    path.write_text(
        '[server.prices]\n"gpt-4o" = { input = 1.0, output = 4.0 }\n'
        '"my-llama" = { input = 0.5, output = 0.5 }\n'
    )
    prices = dex.server.app._prices(ServerConfig.load(path))
    assert prices.of("gpt-4o-2024-08-06").output == 4.0  # overridden
    assert prices.of("my-llama").input == 0.5  # added
    assert prices.of("claude-sonnet-4-5").input == 3.0  # shipped
    path.write_text('[server.prices]\n"gpt-4o" = { input = -1.0, output = 4.0 }\n')
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        ServerConfig.load(path)
