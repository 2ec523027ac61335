"""The ``fabric:``, ``link_mbps:`` and ``dilation:`` keys of an experiment file, at its top level, in a series
or in a run.

This is where the experiment file's fabric profile is parsed (the file is one
of the edges where a profile enters, with the command line): everything
after it holds the :class:`~emulator.model.fabric.FabricProfile`.

``dilation:`` is ``auto`` (the default) or a number. Under ``auto`` the
dilation of each run is chosen from this machine's calibration when the run
starts (:mod:`emulator.runs.dilation`); the profile's own dilation is then
only where the prediction starts from. A number, a ``link_mbps``, a
``fabric`` that names its ``dilation``, or a topology spec that sets a link
rate is explicit, and wins for its level and the levels inside it (a level
inside may say ``dilation: auto`` again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from emulator.base.errors import FieldError
from emulator.model import fabric
from emulator.model.fabric import FabricChoice, FabricProfile

AUTO = "auto"


def has_fabric_keys(data: Mapping[str, Any]) -> bool:
    """Whether a series or a run sets a fabric of its own."""
    return "fabric" in data or "link_mbps" in data or _dilation_number(data) is not None


def _dilation_number(data: Mapping[str, Any]) -> float | None:
    value = data.get("dilation")
    return None if value is None or value == AUTO else value


def auto_dilation_field(where: str, data: Mapping[str, Any], prefix: str) -> bool | None:
    """Whether this level's dilation is chosen automatically: True for ``dilation: auto``, False where the level
    sets a rate or a dilation itself, None where it says nothing (the enclosing level's choice holds)."""
    value = data.get("dilation")
    explicit = "link_mbps" in data or fabric.names_dilation(data.get("fabric"))
    if value == AUTO:
        if explicit:
            raise FieldError(where, f"{prefix}dilation", "auto without link_mbps or a fabric that sets its "
                             "dilation (or leave dilation out)", value)
        return True
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise FieldError(where, f"{prefix}dilation", "auto or a positive number", value)
        if explicit:
            raise FieldError(where, f"{prefix}dilation", "one of dilation, link_mbps or a fabric's own dilation, "
                             "not several", value)
        return False
    return False if explicit else None


def level_choice(auto: bool | None, own: FabricProfile | None, enclosing: FabricChoice) -> FabricChoice:
    """The fabric a level (the top, a series, a run) resolves its topologies on: its own profile (``own``, from
    :func:`fabric_field`), else the enclosing level's; its dilation named where the level says so itself
    (``auto`` False, from :func:`auto_dilation_field`), else as the enclosing level's is."""
    return FabricChoice(own or enclosing.profile, auto is False if auto is not None else enclosing.names_dilation)


def fabric_field(where: str, data: Mapping[str, Any], prefix: str, enclosing: FabricProfile) -> FabricProfile:
    """The fabric profile from the ``fabric:`` and ``link_mbps:`` keys of ``data`` (top level, a series or a run).

    ``fabric`` alone sets it; ``link_mbps`` (or a numeric ``dilation``) keeps
    the real fabric (``fabric``'s, else the enclosing profile's: the
    experiment's, or the default one at the top level) and sets the dilation
    that maps it onto that rate; beside a ``fabric`` that names its own
    ``dilation``, the two must agree.
    """
    link = data.get("link_mbps")
    if link is not None and (isinstance(link, bool) or not isinstance(link, int | float)
                             or not fabric.MIN_LINK_MBPS <= link <= fabric.MAX_LINK_MBPS):
        raise FieldError(where, f"{prefix}link_mbps", f"a rate in Mbit/s from {fabric.MIN_LINK_MBPS:g} to "
                         f"{fabric.MAX_LINK_MBPS:g}", link)
    base = _profile(where, prefix, data["fabric"]) if "fabric" in data else enclosing
    if link is not None:
        if "fabric" in data and fabric.names_dilation(data["fabric"]):
            if abs(link - base.emulated_link_mbps) > 1e-9 * link:
                raise FieldError(where, f"{prefix}link_mbps", f"the fabric's emulated rate "
                                 f"{base.emulated_link_mbps:g} (or leave link_mbps out)", link)
            return base
        return fabric.at_link_rate(base, link, where=f"{where}: {prefix}link_mbps")
    dilation = _dilation_number(data)
    if dilation is not None:
        return base.changed(f"{where}: {prefix}dilation", dilation=dilation)
    return base


def _profile(where: str, prefix: str, raw: object) -> FabricProfile:
    """The ``fabric`` key's profile: a preset, ``key=value`` pairs or a mapping (errors name ``fabric.<key>``)."""
    if not isinstance(raw, str | Mapping):
        raise FieldError(where, f"{prefix}fabric", "a preset name, key=value pairs or a mapping of them", raw)
    try:
        return fabric.parse(raw)
    except FieldError as exc:
        name = "fabric" if exc.field == "(spec)" else f"fabric.{exc.field}"
        raise FieldError(where, f"{prefix}{name}", exc.expected, exc.given) from None
