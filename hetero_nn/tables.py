"""Plain-text tables: the one formatter behind every table the package prints.

Used by the CLI (training summary, ``datasets list``, ``perfmodel``) and by
:class:`~hetero_nn.scheduler.trace.Trace` (``format_stats``, ``format_utilisation``).
Policy: a header, a rule of dashes, then the rows; a column whose cells are all
numbers (a trailing ``%`` allowed, ``-`` for a missing value) is aligned right,
any other to the left; trailing spaces are stripped. It depends on nothing, so any
module may import it.

>>> print(format_table(["codelet", "count"], [["conv2d_fwd", "12"], ["relu", "3"]]))
codelet     count
----------  -----
conv2d_fwd     12
relu            3
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` of strings under ``header``, aligned (numbers right, text left)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in rows) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _is_number(text: str) -> bool:
    if text == "-":
        return True
    try:
        float(text[:-1] if text.endswith("%") else text)
    except ValueError:
        return False
    return True
