"""The README's and docs' runnable blocks run as written.

A fenced ``bash`` (``sh``, ``shell``) or ``python`` block of README.md or docs/*.md is
runnable when the line before it (blank lines aside) is the HTML comment
``<!-- runnable -->`` (``<!-- runnable: slow -->`` for one that takes minutes: it runs
with ``-m slow``; ``torch`` among the tags skips it where PyTorch is missing); any other
block is left alone. The blocks of one file run in order,
in one scratch folder laid out as a checkout (the repository's folders linked in, a
``../shared`` beside it holding the datasets), so a block may use what an earlier one
wrote (``runs/quick``). Shell blocks run under ``bash -e``; Python blocks as scripts.
Each Python process of a block (a Python block, a ``hetero-nn`` command) is a fork of one
interpreter that imported hetero_nn once (:mod:`docs_zygote`; ``HETERO_NN_DOCS_FORK=0``
starts a new interpreter for each instead).
``hetero-nn`` there is this checkout's, with ``--limit 256`` added to ``train`` and
``evaluate`` when the block gives no ``--limit`` (short runs in CI); the data directory
is ``../shared/datasets`` (``HETERO_NN_DATA``).

The blocks' cache (``HETERO_NN_CACHE``) is private to this module and shared by every
file's blocks, as one user's cache is when they read the docs in order: performance
models calibrated by README's blocks serve the later files. Its ``trampolines/`` folder
is the test session's: trampolines are named by a hash of their source and checked
before they are imported, so a block loads the machine code the suite already compiled
instead of compiling it again in each file's first process (about 16 for a LeNet-5 run,
seconds each on a loaded machine).
"""

from __future__ import annotations

import importlib.util
import os
import re
import select
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

import docs_zygote

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
MARK = re.compile(r"<!--\s*runnable(?:\s*:\s*(?P<tags>[a-z, ]+))?\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
LIMIT = "256"  # samples per split for the CLI's train and evaluate
TIMEOUT = 300  # seconds per block
ZYGOTE_ENV = docs_zygote.ENV
#: The repository's entries a block may use, linked into the scratch checkout.
LINKED = ("hetero_nn", "examples", "experiments", "benchmarks", "datasets", "docs",
          "README.md", "pyproject.toml")

SHIM = f"""#!{sys.executable}
import os
import sys

if __name__ == "__main__":  # Dask's worker processes import this file again
    if os.environ.get("{ZYGOTE_ENV}") and "hetero_nn" not in sys.modules:
        sys.path.insert(0, {str(REPO / "tests")!r})  # a client: a fork runs this file
        from docs_zygote import run_in_zygote
        sys.exit(run_in_zygote(__file__, sys.argv))
    from hetero_nn.cli import main
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
def docs_cache(tmp_path_factory):
    """The blocks' ``HETERO_NN_CACHE``: private, with the session's trampolines (docstring)."""
    from helpers import cache_with_shared_trampolines

    return cache_with_shared_trampolines(tmp_path_factory.mktemp("docs") / "cache")


def _environment(docs_cache) -> dict:
    """What every block's process has in its environment (a file's sandbox adds to it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
            "HETERO_NN_CACHE": str(docs_cache), "MPLBACKEND": "Agg", "COLUMNS": "100",
            "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def zygote(tmp_path_factory, docs_cache):
    """The fork server's socket path (tests/docs_zygote.py), or None where it is off
    (``HETERO_NN_DOCS_FORK=0``: every block's process a new interpreter) or did not start."""
    if os.environ.get("HETERO_NN_DOCS_FORK", "1") == "0":
        yield None
        return
    folder = tmp_path_factory.mktemp("zygote")
    path = folder / "socket"
    with open(folder / "stderr", "w") as errors:
        server = subprocess.Popen(
            [sys.executable, str(Path(docs_zygote.__file__)), "serve", str(path)],
            cwd=folder, env=_environment(docs_cache), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        started, _, _ = select.select([server.stdout], [], [], TIMEOUT)
        ready = bool(started) and server.stdout.readline().strip() == "ready"
        if not ready:
            server.kill()
            server.wait()
            warnings.warn(f"the docs' fork server did not start (exit {server.returncode}): "
                          f"{(folder / 'stderr').read_text()[-500:]}; each block's process "
                          f"starts a new interpreter")
        yield str(path) if ready else None
    finally:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory, docs_cache, zygote):
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
            env = {**_environment(docs_cache),
                   "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
                   "HETERO_NN_DATA": str(root / "shared" / "datasets")}
            if zygote:
                env[ZYGOTE_ENV] = zygote
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
        if ZYGOTE_ENV in env:
            argv = [sys.executable, str(Path(docs_zygote.__file__)), "run", str(script)]
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
