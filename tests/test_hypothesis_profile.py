"""The slow run draws fresh property-test examples with a fixed budget (conftest.py).

A tiny derandomized property test is run by pytest in a subprocess, beside copies
of this suite's conftest.py and helpers.py: the default run keeps its own settings
(the same examples each time, its own budget); ``-m slow`` runs it too, on
``RANDOM_EXAMPLES`` fresh examples, different from one run to the next.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RANDOM_EXAMPLES

HERE = Path(__file__).resolve().parent

PROPERTY_TEST = '''
import json, os
from hypothesis import given, settings, strategies as st

@settings(max_examples=7, derandomize=True, database=None)
@given(st.integers(0, 2**60))
def test_draws(value):
    with open(os.environ["DRAWS"], "a") as f:
        f.write(json.dumps(value) + "\\n")

@settings(max_examples=5)
@given(st.integers(0, 2**60))
def test_own_budget(value):
    with open(os.environ["DRAWS"], "a") as f:
        f.write(json.dumps(-1 - value) + "\\n")
'''


def _run(tmp_path, name, *args):
    draws = tmp_path / f"{name}.jsonl"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "test_draws.py", *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "DRAWS": str(draws)})
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in draws.read_text().splitlines()]


@pytest.mark.slow  # about 19 s (two pytest runs); it checks the slow run itself
def test_the_slow_run_draws_fresh_examples_with_a_fixed_budget(tmp_path):
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "test_draws.py").write_text(PROPERTY_TEST)
    first, second = _run(tmp_path, "default-1"), _run(tmp_path, "default-2")
    assert len(first) == 12 and first == second  # derandomized: its own budget, same examples
    assert len([v for v in first if v < 0]) == 5  # one that set no derandomize: the ci profile
    slow_1 = _run(tmp_path, "slow-1", "-m", "slow")
    slow_2 = _run(tmp_path, "slow-2", "-m", "slow")
    assert len(slow_1) >= RANDOM_EXAMPLES and len(slow_2) >= RANDOM_EXAMPLES
    assert set(slow_1) != set(slow_2)  # fresh examples each time
