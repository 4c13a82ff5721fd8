"""Reading a TOML file a user wrote, with errors that name the file and the problem."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from blitzscale.errors import InvalidRequestError


def read_toml(path: Path, label: str) -> dict[str, Any]:
    """`label` says which file it is in errors, e.g. "--config cluster.toml"."""
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise InvalidRequestError(f"{label}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"{label}: not UTF-8 text, so not TOML ({e.reason}, byte {e.start})") from e
    except tomllib.TOMLDecodeError as e:
        raise InvalidRequestError(f"{label}: not valid TOML: {e}") from e
