"""One rule for a topology's own link rate: ``emu replay``, ``emu mpirun``, ``emu schedule check`` and an
experiment's cells resolve the same spec and fabric to the same links and dilation (emulator.model.fabric.resolve)."""

from __future__ import annotations

import pytest

from emulator.base.errors import FieldError
from emulator.cli.arguments import fabric_choice
from emulator.cli.commands.mpirun import mpirun_config
from emulator.cli.commands.replay import replay_config
from emulator.cli.commands.schedule import check_network
from emulator.cli.main import build_parser
from emulator.emulation.session.replay import prepare
from emulator.model import fabric, topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule import format as sformat
from emulator.study import experiment as xp

LEAFSPINE = "leafspine:leaves=2,spines=2,hosts_per_leaf=2"
# (spec, --fabric, expected host link, switch link (Mbit/s) and dilation)
CASES = [
    (LEAFSPINE, None, 20.0, 20.0, 5000.0),  # the profile's rate everywhere
    (f"{LEAFSPINE},bw=10", None, 10.0, 10.0, 10000.0),  # the spec's rate: the dilation follows
    (f"{LEAFSPINE},host_bw=5", None, 5.0, 5.0, 20000.0),  # and the links it leaves unset take the new rate
    (f"{LEAFSPINE},host_bw=5", "dilation=5000", 5.0, 20.0, 5000.0),  # a named dilation keeps the spec's rates
    (f"{LEAFSPINE},switch_bw=5", "ib200", 25.0, 5.0, 8000.0),  # host links unset: the profile's own mapping
    (f"{LEAFSPINE},bw=8", "preset=eth25", 8.0, 8.0, 3125.0),
]


def _rates(topo: topology.Topology, profile: fabric.FabricProfile) -> tuple[float, float, float]:
    return topo.host_bw, topo.switch_bw, profile.dilation


def _schedule_file(tmp_path, spec: str) -> str:
    path = str(tmp_path / "ring.yaml")
    sformat.save(generate("ring", topology.build(spec), 1 << 16), path)
    return path


def _fabric_args(text: str | None) -> list[str]:
    return [] if text is None else ["--fabric", text]


@pytest.mark.parametrize("spec, text, host, switch, dilation", CASES)
def test_replay_mpirun_schedule_check_and_experiment_cells_resolve_alike(tmp_path, spec, text, host, switch,
                                                                         dilation):
    parser = build_parser()
    sched_path = _schedule_file(tmp_path, spec)
    expected = (host, switch, dilation)

    replay_args = parser.parse_args(["replay", sched_path, "--topology", spec, "--routing", "shortest",
                                     "--out", str(tmp_path / "replay"), *_fabric_args(text)])
    prep = prepare(replay_config(replay_args), calibration=None)
    assert _rates(prep.topo, prep.profile) == expected

    mpi_args = parser.parse_args(["mpirun", "--topology", spec, "--routing", "shortest", "--out",
                                  str(tmp_path / "mpi"), *_fabric_args(text), "--", "prog"])
    mpi = mpirun_config(mpi_args)
    assert _rates(mpi.network.topology, mpi.fabric) == expected

    check_args = parser.parse_args(["schedule", "check", sched_path, "--topology", spec, *_fabric_args(text)])
    network = check_network(check_args, sformat.load(sched_path), fabric_choice(check_args.fabric, "schedule check"))
    assert _rates(network.topology, network.profile) == expected

    raw = {"series": [{"name": "s", "runs": [{"topology": spec, "routing": "shortest", "algorithms": ["ring"]}]}]}
    if text is not None:
        raw["fabric"] = text
    (cell,) = [c for c in xp.expand(xp.from_dict(raw)) if c.size == xp.DEFAULT_SIZES[0]]
    assert _rates(topology.build(cell.topology), cell.fabric) == expected


def test_the_rule_itself():
    default = fabric.default()
    same = fabric.resolve(LEAFSPINE)
    assert same.profile == default and same.spec == LEAFSPINE
    follows = fabric.resolve(f"{LEAFSPINE},bw=10")
    assert follows.profile == fabric.at_link_rate(default, 10.0)
    named = fabric.resolve(f"{LEAFSPINE},bw=10", fabric.choose("dilation=5000"))
    assert named.profile.dilation == 5000 and named.topology.host_bw == 10
    assert fabric.choose("dilation=5000").names_dilation and not fabric.choose("roce100").names_dilation
    servers = f"{LEAFSPINE},servers=2,accels_per_server=4,nics_per_server=2"
    h100 = fabric.choose("h100-ndr400")
    assert fabric.resolve(servers, h100).topology.has_domain  # the interconnect at the profile's ratio
    assert not fabric.resolve(servers, h100, interconnect=False).topology.has_domain  # an MPI program's
    with pytest.raises(FieldError, match="replay: topology: field 'dilation'"):
        fabric.resolve(f"{LEAFSPINE},bw=0.05", where="replay: topology")  # no dilation maps the fabric onto it
