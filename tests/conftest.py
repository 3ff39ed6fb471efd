from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# ../shared/reference beside the checkout (CI copies shared/ beside the clone)
REFERENCE = ROOT.parent / "shared" / "reference"


@pytest.fixture
def reference():
    if not REFERENCE.is_dir():
        pytest.skip("../shared/reference not present")
    return REFERENCE
