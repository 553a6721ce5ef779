"""Make the contract importable as ``stores.contract`` in any import mode, with rich asserts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# pytest's default "prepend" mode already puts tests/ on sys.path (tests/stores is a package
# under it); "importlib" mode does not. Spawned writer processes inherit sys.path from here.
_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# The contract's checks live outside the test modules; without this their failures would be
# bare AssertionErrors instead of pytest's explained comparisons.
pytest.register_assert_rewrite("stores.contract")
