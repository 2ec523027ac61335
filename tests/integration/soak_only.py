"""Which integration tests run only in ``make soak`` (``EF_SOAK_LONG=1``), and why each is not in ``make test``.

``make test`` must stay within 15 minutes on the 2-core machine (docs/testing-accuracy.md has the
durations); a test moved here keeps a shorter cousin in ``make test`` that holds the same behaviour, named in
its reason, which pytest's summary prints (``-ra``).
"""

from __future__ import annotations

import os

import pytest


def soak_only(why: str) -> pytest.MarkDecorator:
    """Skip the test unless ``make soak`` runs it; ``why`` names its cost and what covers it in ``make test``."""
    return pytest.mark.skipif(not os.environ.get("EF_SOAK_LONG"), reason=f"`make soak` runs it: {why}")
