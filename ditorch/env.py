"""Boolean environment variables, read the way other tools read them."""
from __future__ import annotations

import os

TRUE = ("1", "true", "yes", "on", "y")
FALSE = ("0", "false", "no", "off", "n", "")


def env_flag(name: str, default: bool) -> bool:
    """``name`` as a boolean (unset: ``default``); anything unrecognisable is an error, never a guess."""
    value = os.environ.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean: use one of {'/'.join(TRUE[:4])} or {'/'.join(FALSE[:4])}")
