"""Make the memory contract importable as ``memory.contract``, with rich asserts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

pytest.register_assert_rewrite("memory.contract")
