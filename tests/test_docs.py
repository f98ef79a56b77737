"""The README's and docs' runnable blocks run as written.

A fenced ``bash`` (``sh``, ``shell``) or ``python`` block of README.md or docs/*.md is
runnable when the line before it (blank lines aside) is the HTML comment
``<!-- runnable -->`` (``<!-- runnable: slow -->`` for one that takes minutes: it runs
with ``-m slow``; ``torch`` among the tags skips it where PyTorch is missing); any other
block is left alone. The blocks of one file run in order,
in one scratch folder laid out as a checkout (the repository's folders linked in, a
``../shared`` beside it holding the datasets), so a block may use what an earlier one
wrote (``runs/quick``). Shell blocks run under ``bash -e``; Python blocks as scripts.
``hetero-nn`` there is this checkout's, with ``--limit 256`` added to ``train`` and
``evaluate`` when the block gives no ``--limit`` (short runs in CI); the data directory
is ``../shared/datasets`` (``HETERO_NN_DATA``); performance models go to a private cache.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
MARK = re.compile(r"<!--\s*runnable(?:\s*:\s*(?P<tags>[a-z, ]+))?\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
LIMIT = "256"  # samples per split for the CLI's train and evaluate
TIMEOUT = 300  # seconds per block
#: The repository's entries a block may use, linked into the scratch checkout.
LINKED = ("hetero_nn", "examples", "experiments", "benchmarks", "datasets", "docs",
          "README.md", "pyproject.toml")

SHIM = f"""#!{sys.executable}
import sys
from hetero_nn.cli import main

if __name__ == "__main__":  # Dask's worker processes import this file again
    argv = sys.argv[1:]
    if argv[:1] in (["train"], ["evaluate"]) and "--resume" not in argv \\
            and not any(a == "--limit" or a.startswith("--limit=") for a in argv):
        argv += ["--limit", "{LIMIT}"]
    sys.exit(main(argv))
"""


@dataclass
class Block:
    path: Path
    line: int       # of the opening fence, 1-based
    language: str   # "shell" or "python"
    code: str
    slow: bool
    torch: bool = False  # ``<!-- runnable: torch -->``: skipped where PyTorch is missing

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def runnable_blocks(path: Path) -> list[Block]:
    """The blocks of ``path`` marked runnable (module docstring), in order.

    A marker before anything but a shell or Python block is an error: the block it was
    meant for would silently not run.
    """
    lines = path.read_text().splitlines()
    blocks, mark, i = [], None, 0
    while i < len(lines):
        line = lines[i].strip()
        fence = FENCE.match(line)
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"),
                       None)
            assert end is not None, f"{path.name}:{i + 1}: a code block that never ends"
            if mark is not None:
                language = LANGUAGES.get(fence.group(1))
                assert language, (f"{path.name}:{mark[0]}: <!-- runnable --> before a "
                                  f"'{fence.group(1) or 'plain'}' block; only bash and "
                                  f"python blocks run")
                blocks.append(Block(path, i + 1, language, "\n".join(lines[i + 1:end]) + "\n",
                                    "slow" in (mark[1] or ""), "torch" in (mark[1] or "")))
            mark, i = None, end + 1
            continue
        found = MARK.fullmatch(line)
        if found:
            mark = (i + 1, found.group("tags"))
        elif line and mark is not None:
            raise AssertionError(f"{path.name}:{mark[0]}: <!-- runnable --> is not followed "
                                 f"by a code block")
        i += 1
    return blocks


def _cases():
    cases = []
    for path in DOCS:
        for n, block in enumerate(runnable_blocks(path)):
            marks = [pytest.mark.slow] if block.slow else []
            if block.torch and importlib.util.find_spec("torch") is None:
                marks.append(pytest.mark.skip(reason="the block needs PyTorch (optional)"))
            cases.append(pytest.param(block, id=f"{path.name}-{n}-line{block.line}",
                                      marks=marks))
    return cases


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory):
    """One scratch checkout per markdown file, shared by its blocks in order."""
    made: dict = {}

    def sandbox(path):
        if path not in made:
            root = tmp_path_factory.mktemp(path.stem)
            checkout = root / "checkout"
            checkout.mkdir()
            for name in LINKED:
                if (REPO / name).exists():
                    (checkout / name).symlink_to(REPO / name)
            (root / "shared").symlink_to(SHARED)
            bin_dir = root / "bin"
            bin_dir.mkdir()
            (bin_dir / "hetero-nn").write_text(SHIM)
            (bin_dir / "hetero-nn").chmod(0o755)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                       [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                   "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
                   "HETERO_NN_DATA": str(root / "shared" / "datasets"),
                   "HETERO_NN_CACHE": str(root / "cache"), "MPLBACKEND": "Agg",
                   "COLUMNS": "100", "PYTHONDONTWRITEBYTECODE": "1"}
            made[path] = (checkout, env)
        return made[path]

    return sandbox


def test_markers_are_well_placed():
    """Every marker sits before a shell or Python block (runnable_blocks asserts it)."""
    counts = {path.name: len(runnable_blocks(path)) for path in DOCS}
    assert counts["README.md"] >= 8, counts


@pytest.mark.skipif(not (SHARED / "datasets").is_dir(),
                    reason=f"the datasets are not in {SHARED / 'datasets'}")
@pytest.mark.parametrize("block", _cases())
def test_block_runs_as_written(block, sandboxes):
    cwd, env = sandboxes(block.path)
    if block.language == "shell":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        script = cwd / f".block-{block.line}.py"
        script.write_text(block.code)
        argv = [sys.executable, str(script)]
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {TIMEOUT} s:\n{block.code}")
    if done.returncode != 0:
        pytest.fail(f"{block.where}: exit status {done.returncode}\n--- block\n{block.code}"
                    f"--- stdout (end)\n{done.stdout[-3000:]}\n--- stderr (end)\n"
                    f"{done.stderr[-3000:]}")


def test_cli_reference_is_current():
    """docs/cli.md's reference part is what the parser prints (docs/cli_reference.py)."""
    import difflib

    from helpers import load_script

    generator = load_script("docs/cli_reference.py")
    page = generator.PAGE.read_text()
    current = generator.render(page)
    if current != page:
        diff = difflib.unified_diff(page.splitlines(), current.splitlines(), "docs/cli.md",
                                    "the parser's help", lineterm="", n=1)
        pytest.fail("docs/cli.md is not current: run `python docs/cli_reference.py` (with this "
                    "checkout's Python 3.11)\n" + "\n".join(list(diff)[:60]))
    assert "--cluster-devices" in page and "resnet-small" in page
