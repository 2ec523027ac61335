"""Shared test set-up: integration tests need root, Mininet and a running Open vSwitch."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def integration_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "integration tests need root"
    for tool in ("mnexec", "ovs-vsctl", "ovs-ofctl", "tc", "iperf3", "ethtool"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run `make setup`)"
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        return "Open vSwitch is not running (run `make setup`)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    checked = False
    for item in items:
        if "integration" in item.keywords:
            if not checked:
                reason, checked = integration_skip_reason(), True
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
