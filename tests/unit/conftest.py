"""Unit-test set-up shared by every module."""

from __future__ import annotations

import pytest

from emulator.study import report


@pytest.fixture(autouse=True)
def small_report_projection(monkeypatch):
    """Reports project to 128 accelerators only, not to 1024 (and grow designs on servers to 32 only).

    The paper-scale projection up to 1024 ranks takes about 40 s of CPU in
    each test process, and a report's tests check the report, not the
    projection: ``test_paper_scale.py`` checks that, at 1024 accelerators too.
    """
    monkeypatch.setattr(report, "PROJECTED_HOSTS", (128,))
    monkeypatch.setattr(report, "DESIGN_HOSTS", (32,))
