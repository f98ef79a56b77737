"""Plain-text tables: the one formatter behind every table the package prints.

Used by the CLI (training summary, ``datasets list``, ``perfmodel``) and by
:class:`~hetero_nn.scheduler.trace.Trace` (``format_stats``, ``format_utilisation``).
Policy: a header, a rule of dashes, then the rows; a column whose cells are all
numbers (a trailing ``%`` allowed, ``-`` for a missing value) is aligned right,
any other to the left; trailing spaces are stripped. A table wider than ``width``
(100 columns by default) wraps its widest text columns but the first (a row's name,
kept whole so that no piece of it reads as a row of its own; the table widens instead):
a long cell continues on the next lines of its row, broken after the last ``|``, ``_``,
``.``, ``,`` or space that fits. It depends on nothing, so any module may import it.

>>> print(format_table(["codelet", "count"], [["conv2d_fwd", "12"], ["relu", "3"]]))
codelet     count
----------  -----
conv2d_fwd     12
relu            3
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["format_table"]


#: Columns a table may take before its text columns wrap.
WIDTH = 100
_MIN_WRAPPED = 12  # a wrapped column keeps at least this many characters


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                 width: int | None = WIDTH) -> str:
    """``rows`` of strings under ``header``, aligned (numbers right, text left), wrapped
    to ``width`` columns (None: never)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in rows) for i in range(len(header))]
    if width is not None:
        _fit(widths, header, numeric, width)

    def lines(cells):
        parts = [_wrap(c, w) if not num else [c] for c, w, num in zip(cells, widths, numeric)]
        out = []
        for k in range(max(len(p) for p in parts)):
            out.append("  ".join((p[k] if k < len(p) else "").rjust(w) if num else
                                 (p[k] if k < len(p) else "").ljust(w)
                                 for p, w, num in zip(parts, widths, numeric)).rstrip())
        return out

    out = lines(header) + lines(["-" * w for w in widths])
    for r in rows:
        out += lines(r)
    return "\n".join(out)


def _fit(widths, header, numeric, width):
    """Cap the text columns (in place) at the largest width that makes the table fit
    ``width``, none narrower than its header or ``_MIN_WRAPPED``."""
    text = [i for i, num in enumerate(numeric) if not num]
    floor = {i: min(widths[i], max(_MIN_WRAPPED, len(header[i]))) for i in text}
    if 0 in floor:  # the row's name stays whole: its pieces would read as rows of their own
        floor[0] = widths[0]

    def total(cap):
        return sum(max(floor[i], min(w, cap)) if i in floor else w
                   for i, w in enumerate(widths)) + 2 * (len(widths) - 1)

    if total(max(widths)) <= width:
        return
    cap = max(widths)
    while cap > 0 and total(cap) > width:
        cap -= 1
    for i in text:
        widths[i] = max(floor[i], min(widths[i], cap))


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in pieces of at most ``width`` characters, broken after the last
    separator of a piece where it has one (a token is cut only when it is longer)."""
    pieces = []
    while len(text) > width:
        cut = max(text.rfind(sep, 1, width) for sep in "|_., ")
        cut = width if cut < 0 else cut + 1
        pieces.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return pieces + [text]


def _is_number(text: str) -> bool:
    if text == "-":
        return True
    try:
        float(text[:-1] if text.endswith("%") else text)
    except ValueError:
        return False
    return True
