"""Optional extras (`pip install 'dflash-doctor[tensorboard]'`): a config that asks for one that is not
installed is refused when it is read, before anything starts, with the command that installs it."""

from __future__ import annotations

import importlib.util

from dflash_base.errors import ConfigError

EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}


def require_extra(module: str, field: str) -> None:
    """ConfigError naming the extra when `module` cannot be imported (checked when the config is read)."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{field}: needs the `{module}` package, which is not installed",
            hint=f"pip install 'dflash-doctor[{EXTRAS[module]}]'  (or pip install {module})",
        )
