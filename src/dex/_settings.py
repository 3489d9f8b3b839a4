"""Frozen settings objects that the command line fills from flags, ``DEX_*`` variables and
a config file (pydantic-settings).

Built in code (``ServerConfig(heartbeat_timeout=5)``) a settings object holds what it is
given and the defaults, and reads nothing from the environment. ``load()`` is what the
``dex`` command uses; it takes, for each field, the first of::

    a flag given on the command line
    its environment variable (each field names its own: DEX_DATA_DIR, ...)
    the config file's table (``[server]`` or ``[worker]`` in ``--config dex.toml``)
    the default
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

_LOADING: ContextVar[tuple[Path | None] | None] = ContextVar("dex_settings_loading", default=None)
"""Set while ``load()`` builds a settings object: (the config file, if any)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,  # a field by its name in code and in the file; its alias in env
        case_sensitive=True,  # DEX_DATA_DIR, not data_dir or Dex_Data_Dir
    )
    table: ClassVar[str]
    """This object's table in the config file."""

    @classmethod
    def load(cls, config_file: Path | None = None, **flags: Any) -> Self:
        """Flags (``None``: not given) over environment variables over ``config_file``'s
        table over defaults."""
        if config_file is not None and not config_file.is_file():
            raise ValueError(f"no config file {config_file}")
        token = _LOADING.set((config_file,))
        try:
            return cls(**{k: v for k, v in flags.items() if v is not None})
        finally:
            _LOADING.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        loading = _LOADING.get()
        if loading is None:
            return (init_settings,)
        (config_file,) = loading
        if config_file is None:
            return (init_settings, env_settings)
        file = TomlConfigSettingsSource(settings_cls, config_file, (cls.table,))
        return (init_settings, env_settings, file)
