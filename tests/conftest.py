from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Published and Megatron-computed reference data, copied into the repo with their sources
# (validation/data/README.md), so that a clone reproduces every check.
REFERENCE = ROOT / "validation" / "data"


@pytest.fixture
def reference():
    return REFERENCE
