"""The keys of the JSON files a user writes for hetero_nn: a key the format does not
define is refused.

Policy: a misspelled key (``"wokers"`` for ``"workers"``) would otherwise be read as
absent, and its default would give a wrong answer without a word. Every reader of a
user-written JSON object (the platform files of :mod:`hetero_nn.simulation.machine` and
:mod:`hetero_nn.simulation.platforms`) passes it through :func:`check_keys` with the
keys its format defines: the first unknown key is a :class:`~hetero_nn.errors.ConfigError`
of one line naming the file (and entry), the key and the closest valid one
(:func:`difflib.get_close_matches`), or the valid ones when none is close.
"""

from __future__ import annotations

import difflib

from .errors import ConfigError

__all__ = ["check_keys"]


def check_keys(doc: dict, allowed, where: str) -> None:
    """Raise ConfigError ``"<where>: unknown key 'k'; did you mean 'key'?"`` for the
    first key of ``doc`` not in ``allowed``."""
    allowed = list(allowed)
    for key in doc:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = (f"did you mean {close[0]!r}?" if close
                else f"the keys are {', '.join(repr(k) for k in allowed)}")
        raise ConfigError(f"{where}: unknown key {key!r}; {hint}")
