"""``python -m zerda.cli``: the ``zerda`` command."""

from __future__ import annotations

import sys

from zerda.cli import main

sys.exit(main())
