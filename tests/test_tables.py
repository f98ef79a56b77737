"""format_table: aligned columns, and tables wider than 100 columns wrap their text columns."""

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.tables import WIDTH, format_table

FOOTPRINT = "64x1x28x28:<f4|6x1x5x5:<f4|6:<f4|64x6x24x24:<f4|64x6x12x12:<f4|64x6x12x12:<i8"


def _starts(table):
    """Where each column starts, from the rule of dashes."""
    rule = table.splitlines()[1]
    starts, i = [], 0
    for part in rule.split("  "):
        starts.append(i)
        i += len(part) + 2
    return starts


def test_narrow_tables_are_as_before():
    text = format_table(["codelet", "count"], [["conv2d_fwd", "12"], ["relu", "3"]])
    assert text.splitlines() == ["codelet     count", "----------  -----",
                                 "conv2d_fwd     12", "relu            3"]


def test_a_perfmodel_like_table_fits_100_columns_and_loses_no_character():
    header = ["codelet", "variant", "kind", "footprint", "size", "count", "mean (us)"]
    rows = [["conv2d_relu_pool_bwd_params.overwrite", "cpu:im2col", "cpu", FOOTPRINT,
             "7902720", "23", "1234.567"], ["relu", "ref", "cpu", "8:<f4", "8", "3", "0.5"]]
    table = format_table(header, rows)
    lines = table.splitlines()
    assert max(map(len, lines)) <= WIDTH < len(FOOTPRINT) + 60
    starts = _starts(table)
    first = [line[starts[3]:starts[4]].strip() for line in lines[2:-1]]
    assert "".join(first) == FOOTPRINT  # broken after '|', nothing dropped
    assert all(piece.endswith("|") for piece in first[:-1])
    assert lines[2].rstrip().endswith("1234.567")  # numbers on the row's first line
    assert lines[-1].split() == ["relu", "ref", "cpu", "8:<f4", "8", "3", "0.5"]
    assert format_table(header, rows, width=None).splitlines()[2].endswith("1234.567")
    assert len(format_table(header, rows, width=None).splitlines()) == 4


words = st.text(alphabet="abcdefgh_|., ", min_size=0, max_size=60)


@given(rows=st.lists(st.tuples(words, st.integers(0, 10**6), words), min_size=1, max_size=6),
       width=st.integers(40, 120))
@settings(max_examples=100, deadline=None)
def test_random_tables_fit_and_keep_their_text(rows, width):
    cells = [(a.strip() or "x", str(n), b.strip() or "y") for a, n, b in rows]
    table = format_table(["name", "n", "note"], cells, width=width)
    lines = table.splitlines()
    needed = len("name") + max(len(c[1]) for c in cells) + len("note") + 4
    if width >= needed + 2 * 12:
        assert max(map(len, lines)) <= width
    starts = _starts(table)
    # rebuild each row: a line whose number column is blank continues the row above
    rebuilt = []
    for line in lines[2:]:
        parts = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if rebuilt and not parts[1]:
            rebuilt[-1] = [p + (" " if p and q and not p.endswith(tuple("|_.,")) else "") + q
                           for p, q in zip(rebuilt[-1], parts)]
        else:
            rebuilt.append(parts)
    assert [r[1] for r in rebuilt] == [c[1] for c in cells]
    for got, (a, _, b) in zip(rebuilt, cells):
        assert got[0].replace(" ", "") == a.replace(" ", "")
        assert got[2].replace(" ", "") == b.replace(" ", "")


def test_a_long_first_column_is_never_wrapped_into_what_reads_as_a_row():
    """Issue 30, item 8: ``.overwrite`` / ``.redux`` pieces of a codelet name read as rows."""
    from hetero_nn.tables import format_table

    name = "conv2d_relu_pool_bwd_params_im2col_blocked.overwrite"
    rows = [[name, "cpu_im2col_blocked_variant_with_a_long_name", "12", "1.5"],
            ["relu", "cpu", "3", "0.1"]]
    lines = format_table(["codelet", "variant", "count", "total ms"], rows, width=60).splitlines()
    assert lines[2].startswith(name)
    names = [line.split("  ")[0] for line in lines[2:] if not line.startswith(" ")]
    assert names == [name, "relu"]  # a continuation line starts blank: no row of its own
