"""Write the command reference of docs/cli.md from the ``hetero-nn`` parser.

The part of ``docs/cli.md`` between the lines ``<!-- BEGIN cli reference -->`` and
``<!-- END cli reference -->`` is generated: for the command and for every subcommand
(found by walking the parser, so a new command or option appears by itself), a heading
and its ``--help`` at 100 columns. The rest of the page is prose and is left alone.

    python docs/cli_reference.py            # rewrite docs/cli.md
    python docs/cli_reference.py --check    # exit 1 if docs/cli.md is not current

``tests/test_docs.py`` runs the check.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().with_name("cli.md")
BEGIN = "<!-- BEGIN cli reference -->"
END = "<!-- END cli reference -->"
COLUMNS = 100


def _subcommands(parser, path=()):
    """``(path, parser)`` for ``parser`` and each subparser under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, (*path, name))


def reference() -> str:
    """The generated part of the page, its markers included."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)  # argparse wraps help to the terminal's width
    try:
        from hetero_nn.cli import build_parser

        parts = [BEGIN, "", "Generated from the parser by `python docs/cli_reference.py`: "
                 "do not edit by hand.", ""]
        for path, parser in _subcommands(build_parser()):
            name = " ".join(("hetero-nn", *path))
            parts += [f"### `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        return "\n".join(parts + [END])
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def render(page: str) -> str:
    """``page`` with its reference part replaced by :func:`reference`."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise SystemExit(f"{PAGE}: expected one {BEGIN} and one {END} line")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return head + reference() + tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page is not current, writing nothing")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(PAGE.parents[1]))  # this checkout's hetero_nn, not an installed one
    page = PAGE.read_text()
    current = render(page)
    if args.check:
        if current != page:
            print(f"{PAGE} is not current: run python docs/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    if current != page:
        PAGE.write_text(current)
        print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
