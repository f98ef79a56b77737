"""The README's promises that a test can hold: ``.ci/run`` runs exactly its commands."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _first_block(markdown: str, heading: str) -> list[str]:
    """The commands of the first ```bash block under ``heading`` (comments dropped)."""
    section = markdown.split(f"\n{heading}\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_ci_runs_exactly_the_readme_commands():
    readme = (REPO / "README.md").read_text()
    expected = _first_block(readme, "## Install") + _first_block(readme, "## Run the tests")
    script = (REPO / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in script
                if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert commands == expected
