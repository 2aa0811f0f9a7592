"""The agent's configuration: a frozen pydantic model tree loaded from one TOML file.

`load_config(path)` (`loading`) turns every way a file can be wrong into one `ConfigError`
naming the dotted key (`cloudly.url`) and the reason. The sections (`sections`) build the
settings objects of the parts they configure and read each default from the part it tunes;
the shared value types and checks live in `fields`. The model holds no secret, only the paths
of the files that hold them: `secretfiles` reads them (`read_secret_file`, `load_secrets`),
a systemd credential (`${CREDENTIALS_DIRECTORY}/NAME`) included. `config.example.toml` at the
repository root documents every key.

`[health]` names the local health endpoint, the agent's only listener: a loopback TCP address
(an IP literal in 127.0.0.0/8 or ::1; anything else is refused) or `unix:/absolute/path`.

The names importers use are here; the modules are this package's own seams.
"""

from __future__ import annotations

from agent.config.fields import CREDENTIALS_VARIABLE
from agent.config.loading import load_config
from agent.config.secretfiles import (
    Secrets,
    credential_path,
    is_credential,
    load_secrets,
    read_secret_file,
)
from agent.config.sections import (
    CloudlyConfig,
    Config,
    CorestoreConfig,
    HealthConfig,
    LogConfig,
    MemoryConfig,
    ShutdownConfig,
    StateConfig,
    StreamsConfig,
)
from agent.session.settings import websocket_url
from agent.watch.listen import HealthListen

__all__ = [
    "CREDENTIALS_VARIABLE",
    "CloudlyConfig",
    "Config",
    "CorestoreConfig",
    "HealthConfig",
    "HealthListen",
    "LogConfig",
    "MemoryConfig",
    "Secrets",
    "ShutdownConfig",
    "StateConfig",
    "StreamsConfig",
    "credential_path",
    "is_credential",
    "load_config",
    "load_secrets",
    "read_secret_file",
    "websocket_url",
]
