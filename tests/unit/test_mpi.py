"""``emu mpirun``'s pure part (emulator.runs.mpi_plan) and its refusals of bad input, before anything starts."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.base.errors import FieldError, UserError
from emulator.cli.commands.mpirun import exit_code
from emulator.cli.main import main
from emulator.emulation.mpi import mpi_run
from emulator.model import fabric, topology
from emulator.model.collectives.placements import hdrm_placement
from emulator.runs.mpi_plan import (
    BENCH_JSON,
    DEFAULT_NICE,
    RESERVED_MCA,
    MpiRunConfig,
    RemoteLaunch,
    daemon_start_failed,
    fetch_output_command,
    host_name,
    hostfile_text,
    launch_agent_script,
    mca_settings,
    mpirun_command,
    named,
    parse_mca,
    program_argv,
    rank_hosts,
    resolve_program,
    split_fetched,
)
from emulator.runs.mpi_results import MpiResults, RankPlace, load_results
from emulator.runs.results import Fidelity

BIGRAPH = "bigraph:upper=2,lower=2,hosts_per_switch=2"
LEAFSPINE = "leafspine:leaves=2,spines=2,hosts_per_leaf=4"


# ------------------------------------------------------------------ --mca
def test_mca_pairs_are_kept_in_order_and_a_repeated_key_takes_the_last_value():
    assert parse_mca([["btl", "tcp,self"], ["coll_tuned_use_dynamic_rules", "1"], ["btl", "^openib"]]) == (
        ("btl", "^openib"), ("coll_tuned_use_dynamic_rules", "1"))


@pytest.mark.parametrize("pair", [["Btl", "tcp"], ["btl tcp", "x"], ["btl-tcp", "x"], ["", "x"], ["1btl", "x"]])
def test_a_malformed_mca_name_is_refused_naming_the_field(pair):
    with pytest.raises(FieldError) as err:
        parse_mca([pair])
    assert err.value.field == "mca" and err.value.given == pair[0]


@pytest.mark.parametrize("value", ["", "a\nb"])
def test_an_empty_or_multi_line_mca_value_is_refused(value):
    with pytest.raises(FieldError, match="non-empty one-line value for btl"):
        parse_mca([["btl", value]])


@pytest.mark.parametrize("key", RESERVED_MCA)
def test_the_parameters_emu_mpirun_sets_itself_are_refused(key):
    with pytest.raises(FieldError, match="does not set itself"):
        parse_mca([[key, "x"]])


def test_mca_settings_put_the_launch_agent_and_subnet_first_and_let_the_user_replace_the_defaults():
    own = mca_settings((), "/run/agent")
    assert own[0] == ("plm_rsh_agent", "/run/agent")
    assert ("oob_tcp_if_include", "10.0.0.0/8") in own and ("btl_tcp_if_include", "10.0.0.0/8") in own
    assert ("btl", "tcp,self") in own and ("btl_tcp_progress_thread", "1") in own
    user = mca_settings((("btl", "tcp,self,vader"),), "/run/agent")
    assert [kv for kv in user if kv[0] == "btl"] == [("btl", "tcp,self,vader")]


# -------------------------------------------------------------- placement
def test_identity_and_np_take_the_first_hosts():
    topo = topology.load(LEAFSPINE)
    assert rank_hosts(topo, "identity", None) == [h.name for h in topo.hosts]
    assert rank_hosts(topo, "identity", 3) == ["h1", "h2", "h3"]


def test_hdrm_places_ranks_as_for_schedules():
    topo = topology.load(BIGRAPH)
    assert rank_hosts(topo, "hdrm", None) == hdrm_placement(topo)


def test_random_placement_follows_the_seed():
    topo = topology.load(LEAFSPINE)
    assert rank_hosts(topo, "random", None, seed=3) == rank_hosts(topo, "random", None, seed=3)
    assert sorted(rank_hosts(topo, "random", None, seed=3), key=lambda n: int(n[1:])) == [h.name for h in topo.hosts]


@given(st.integers(min_value=-3, max_value=40))
def test_np_must_fit_the_hosts(np):
    topo = topology.load(LEAFSPINE)
    if 1 <= np <= 8:
        assert len(rank_hosts(topo, "identity", np)) == np
    else:
        with pytest.raises(FieldError) as err:
            rank_hosts(topo, "identity", np)
        assert err.value.field == "np" and "1..8" in err.value.expected


def test_hdrm_on_a_topology_without_it_names_mpirun_and_the_field():
    with pytest.raises(FieldError) as err:
        rank_hosts(topology.load(LEAFSPINE), "hdrm", None)
    assert str(err.value).startswith("mpirun: field 'placement'")


def test_a_placement_file_lists_hosts_in_rank_order(tmp_path):
    path = tmp_path / "place.txt"
    path.write_text("# rank order\nh3\n\nh1  # rank 1\nh2\n")
    topo = topology.load(LEAFSPINE)
    assert rank_hosts(topo, str(path), None) == ["h3", "h1", "h2"]
    assert rank_hosts(topo, str(path), 2) == ["h3", "h1"]


@pytest.mark.parametrize("text, np, what", [
    ("h1\nh99\n", None, "host names"),
    ("h1\nh2\nh1\n", None, "at most once"),
    ("h1\nh2\n", 4, "at least 4 hosts"),
    ("# nothing\n", None, "at least 1 hosts"),
])
def test_a_bad_placement_file_is_refused_naming_the_field(tmp_path, text, np, what):
    path = tmp_path / "place.txt"
    path.write_text(text)
    with pytest.raises(FieldError) as err:
        rank_hosts(topology.load(LEAFSPINE), str(path), np)
    assert err.value.field == "placement" and what in err.value.expected


def test_an_unknown_placement_name_is_refused():
    with pytest.raises(FieldError, match="identity, random, hdrm, rail or a file"):
        rank_hosts(topology.load(LEAFSPINE), "/no/such/file", None)


# ----------------------------------------------------------------- program
def _script(path, body="#!/bin/sh\nexit 0\n", mode=0o755):
    path.write_text(body)
    path.chmod(mode)
    return str(path)


def test_a_program_is_found_in_the_emulators_bin_first_then_on_path(tmp_path):
    own = tmp_path / "bin"
    own.mkdir()
    mine = _script(own / "tool")
    assert resolve_program("tool", which=lambda n: "/usr/bin/tool", own_bin=str(own)) == mine
    assert resolve_program("other", which=lambda n: f"/usr/bin/{n}", own_bin=str(own)) == "/usr/bin/other"


def test_an_unknown_or_not_executable_program_is_refused(tmp_path):
    with pytest.raises(FieldError) as err:
        resolve_program("no-such-program-anywhere", which=lambda n: None)
    assert err.value.field == "program"
    plain = _script(tmp_path / "plain", mode=0o644)
    with pytest.raises(FieldError, match="an executable file"):
        resolve_program(plain)
    with pytest.raises(FieldError, match="a program after --"):
        resolve_program("")


def test_the_bundled_benchmark_writes_its_rows_into_the_run_folder_unless_told_otherwise():
    argv = program_argv(("emu-allreduce-bench", "--algo", "ring"), "/venv/bin/emu-allreduce-bench", "/out")
    assert argv == ["/venv/bin/emu-allreduce-bench", "--algo", "ring", "--json", os.path.join("/out", BENCH_JSON)]
    given_json = program_argv(("emu-allreduce-bench", "--json", "x.json"), "/venv/bin/emu-allreduce-bench", "/out")
    assert given_json.count("--json") == 1
    assert program_argv(("python3", "prog.py"), "/usr/bin/python3", "/out") == ["/usr/bin/python3", "prog.py"]


# ------------------------------------------------------ launch and command
def test_the_hostfile_has_one_slot_per_rank_in_rank_order():
    assert hostfile_text(["10.0.0.3", "10.0.0.1"]) == "10.0.0.3 slots=1\n10.0.0.1 slots=1\n"


#: What the launch agent runs a command in: a shell that names the host first (mpi_plan.host_name).
NAMED_SHELL = 'unshare --uts /bin/sh -c hostname "$0" && exec /bin/sh -c "$1"'


def test_each_host_gets_its_own_host_name_for_open_mpi():
    assert host_name("10.0.0.12") == "10-0-0-12"
    assert named("10.0.0.1", ["mpirun", "-np", "2"]) == ["unshare", "--uts", "/bin/sh", "-c",
                                                         'hostname "$0" && exec "$@"', "10-0-0-1", "mpirun", "-np", "2"]


@pytest.fixture
def fake_mnexec(tmp_path, monkeypatch):
    """An ``mnexec`` on PATH that prints what it was asked to run instead of entering a namespace."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    _script(bindir / "mnexec", '#!/bin/sh\necho "mnexec $*"\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


def test_the_launch_agent_enters_the_named_hosts_namespace(tmp_path, fake_mnexec):
    agent = _script(tmp_path / "agent", launch_agent_script([("10.0.0.1", 101), ("10.0.0.2", 202)],
                                                            str(tmp_path / "agent.log")))
    res = subprocess.run([agent, "10.0.0.2", "orted", "-mca", "ess", '"env"'], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0
    # in a UTS namespace of its own named after the host (the fake mnexec only prints: nothing is renamed here)
    assert res.stdout.strip() == f'mnexec -a 202 {NAMED_SHELL} 10-0-0-2 orted -mca ess "env"'
    assert "10.0.0.2 orted" in (tmp_path / "agent.log").read_text()


def test_the_launch_agent_reaches_another_servers_host_over_ssh_from_the_heads_namespace(tmp_path, fake_mnexec):
    # fake nsenter and ssh: nsenter runs what follows its --, ssh hands its last word to a shell, as a remote
    # login shell would, so the command the other server's shell gets is what runs
    _script(fake_mnexec / "nsenter", '#!/bin/sh\necho "nsenter $1" >&2\nshift 2\nexec "$@"\n')
    _script(fake_mnexec / "ssh", '#!/bin/sh\nfor last; do :; done\necho "ssh to $3" >&2\nexec /bin/sh -c "$last"\n')
    _script(fake_mnexec / "prlimit", '#!/bin/sh\necho "prlimit $1" >&2\nshift\nexec "$@"\n')
    remote = {"10.0.0.2": RemoteLaunch(4242, ("ssh", "-p", "22", "root@10.77.0.2", "--"), 1 << 30)}
    agent = _script(tmp_path / "agent", launch_agent_script([("10.0.0.1", 101), ("10.0.0.2", 202)],
                                                            str(tmp_path / "agent.log"), remote))
    res = subprocess.run([agent, "10.0.0.2", "orted", "-mca", "ess", '"env"', "--x", "it's"], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f'mnexec -a 202 {NAMED_SHELL} 10-0-0-2 orted -mca ess "env" --x it\'s'
    assert res.stderr.splitlines() == ["nsenter --net=/proc/4242/ns/net", "ssh to root@10.77.0.2",
                                       f"prlimit --data={1 << 30}"]
    local = subprocess.run([agent, "10.0.0.1", "orted"], capture_output=True, text=True, check=False)
    assert local.stdout.strip() == f"mnexec -a 101 {NAMED_SHELL} 10-0-0-1 orted" and local.stderr == ""


def test_rank_output_fetched_from_a_server_splits_into_its_files_and_stays_in_the_folder():
    text = ("\n@@ef-file 1/rank.1/stdout\nline one\nline two\n\n@@ef-file 1/rank.1/stderr\n"
            "\n@@ef-file ../escape\nx\n\n@@ef-file /abs\ny")
    assert split_fetched(text) == {"1/rank.1/stdout": "line one\nline two\n", "1/rank.1/stderr": ""}
    cmd = fetch_output_command("/out dir/ranks")
    assert cmd[:2] == ["sh", "-c"] and "cd '/out dir/ranks'" in cmd[2]


def test_the_launch_agent_refuses_a_host_of_another_network_as_ssh_would(tmp_path, fake_mnexec):
    agent = _script(tmp_path / "agent", launch_agent_script([("10.0.0.1", 101)], str(tmp_path / "agent.log")))
    res = subprocess.run([agent, "192.0.2.9", "orted"], capture_output=True, text=True, check=False)
    assert res.returncode == 255 and "not a host of this network" in res.stderr


def test_the_mpirun_command_unbinds_nices_and_exports_the_path():
    cmd = mpirun_command(8, "/out/hostfile", [("btl", "tcp,self")], ["/bin/prog", "-x"], "/out/ranks")
    assert cmd[:3] == ["nice", "-n", str(DEFAULT_NICE)]
    assert cmd[3] == "mpirun" and "--allow-run-as-root" in cmd
    joined = " ".join(cmd)
    assert "-np 8 --hostfile /out/hostfile --bind-to none --leave-session-attached --output-filename /out/ranks" in joined
    assert "--mca btl tcp,self" in joined and "-x PATH" in joined
    assert cmd[-2:] == ["/bin/prog", "-x"]


# ----------------------------------------------------------------- results
def test_results_round_trip_and_are_told_apart_from_a_replays(tmp_path):
    res = MpiResults(config={"out": "/o"}, ranks=[RankPlace(0, "h1", "10.0.0.1")], command=["mpirun"],
                     link_mbps=20.0, status="ok", exit_status=0, wall_s=3.5,
                     fidelity=Fidelity(cpu_idle=0.01, datapath_load_mbps=100.0, datapath_capacity_mbps=1500.0,
                                       flags=["cpu_saturated"], trusted=False),
                     bench=[{"size": 1024, "busbw_mbps": 9.0}])
    path = str(tmp_path / "results.json")
    res.save(path)
    back = load_results(path)
    assert back.to_json() == res.to_json() and not back.trusted
    (tmp_path / "replay.json").write_text('{"config": {}}')
    with pytest.raises(UserError, match="not the results of emu mpirun"):
        load_results(str(tmp_path / "replay.json"))


# ------------------------------------------------- the command's refusals
@pytest.mark.parametrize("args, field", [
    (["--np", "99", "--", "emu-allreduce-bench"], "np"),
    (["--", "no-such-mpi-program-xyz"], "program"),
    (["--mca", "Bad-Key", "1", "--", "emu-allreduce-bench"], "mca"),
    (["--mca", "plm_rsh_agent", "ssh", "--", "emu-allreduce-bench"], "mca"),
    (["--placement", "nowhere", "--", "emu-allreduce-bench"], "placement"),
    ([], "program"),
])
def test_bad_input_is_one_line_and_status_2_and_nothing_is_written(tmp_path, capsys, args, field):
    out = tmp_path / "run"
    status = main(["mpirun", "--topology", LEAFSPINE, "--routing", "ecmp", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and f"field '{field}'" in err
    assert not out.exists()


def test_a_bad_placement_file_is_refused_by_the_command(tmp_path, capsys):
    place = tmp_path / "place.txt"
    place.write_text("h1\nh42\n")
    status = main(["mpirun", "--topology", LEAFSPINE, "--routing", "ecmp", "--out", str(tmp_path / "run"),
                   "--placement", str(place), "--", "emu-allreduce-bench"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and "'h42'" in err


def test_an_mca_without_its_value_is_one_line(tmp_path, capsys):
    status = main(["mpirun", "--topology", LEAFSPINE, "--routing", "ecmp", "--out", str(tmp_path / "run"),
                   "--mca", "btl"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and "field 'mca'" in err


def test_the_bundled_benchmark_is_installed_as_a_script_beside_emu():
    found = shutil.which("emu-allreduce-bench", path=os.path.dirname(sys.executable))
    assert found is not None and os.stat(found).st_mode & stat.S_IXUSR


@pytest.mark.parametrize("status, exit_status, code", [("ok", 0, 0), ("failed", 3, 3), ("failed", -9, 137),
                                                       ("timeout", -15, 124), ("failed", None, 1)])
def test_the_command_exits_with_the_programs_status(status, exit_status, code):
    res = MpiResults(config={}, ranks=[], command=[], link_mbps=1.0, status=status, exit_status=exit_status)
    assert exit_code(res) == code


def test_only_a_start_up_whose_daemons_died_before_any_rank_is_started_again():
    died = "orted: topology.c:593: hwloc__tma_dup_infos: Assertion failed.\nORTE was unable to reliably start one " \
           "or more daemons.\n"
    assert daemon_start_failed(died, ranks_started=False)
    assert not daemon_start_failed(died, ranks_started=True)
    assert not daemon_start_failed("rank 1 exited with status 3\n", ranks_started=False)


# ------------------------------------------------------------- confinement
def test_mpirun_starts_under_the_memory_limit_so_every_process_of_the_run_inherits_it():
    cmd = mpirun_command(2, "/out/hostfile", [], ["/bin/prog"], "/out/ranks", memory_limit_bytes=600 << 20)
    assert cmd[:3] == ["prlimit", f"--data={600 << 20}", "--"] and cmd[3:6] == ["nice", "-n", str(DEFAULT_NICE)]
    assert mpirun_command(2, "/out/hostfile", [], ["/bin/prog"], "/out/ranks")[0] == "nice"


def test_the_memory_limit_is_in_the_config_and_the_results(tmp_path):
    cfg = MpiRunConfig(network=fabric.rebuild("star:hosts=2", interconnect=False), routing="shortest", out="/o",
                       program=("prog",), memory_limit_bytes=123 << 20)
    assert cfg.to_json()["memory_limit_bytes"] == 123 << 20
    assert MpiRunConfig(fabric.rebuild("star:hosts=2", interconnect=False), "shortest", "/o",
                        ("prog",)).to_json()["memory_limit_bytes"] is None
    res = MpiResults(config=cfg.to_json(), ranks=[], command=[], link_mbps=10.0, memory_limit_bytes=123 << 20,
                     out_of_memory=[1])
    path = str(tmp_path / "results.json")
    res.save(path)
    back = load_results(path)
    assert back.memory_limit_bytes == 123 << 20 and back.out_of_memory == [1] and back.to_json() == res.to_json()


def test_the_limit_is_the_admission_estimate_of_the_program():
    from emulator.emulation.mpi import mpi_run as mpirun
    from emulator.runs import admission
    machine = (20 << 30, 24 << 30)
    usable = admission.Machine(*machine).usable_bytes
    bench = ("emu-allreduce-bench", "--algo", "ring", "--sizes", "4MiB")
    assert mpirun.memory_limit_bytes(bench, 4, lambda: machine) == admission.mpi_rank_limit_bytes(
        3 * (4 << 20), 4, usable)
    # a program of unknown size: an equal share of what the machine can give
    assert mpirun.memory_limit_bytes(("python3", "app.py"), 4, lambda: machine) == usable // 4


@pytest.mark.parametrize("limit", [0, -5, 1.5, True, "1GiB"])
def test_a_bad_memory_limit_is_refused_naming_the_field(tmp_path, limit):
    from emulator.emulation.mpi import mpi_run as mpirun
    cfg = MpiRunConfig(network=fabric.rebuild("star:hosts=2", interconnect=False), routing="shortest",
                       out=str(tmp_path / "o"), program=("emu-allreduce-bench",), memory_limit_bytes=limit)
    with pytest.raises(FieldError, match="field 'memory_limit_bytes'"):
        mpirun.prepare(cfg)


def test_the_ranks_whose_stderr_says_they_ran_out_are_found(tmp_path):
    from emulator.emulation.mpi import mpi_run as mpirun
    (tmp_path / "rank-0.stderr").write_text("")
    (tmp_path / "rank-1.stderr").write_text("Traceback ...\nMemoryError: Unable to allocate 16.0 GiB\n")
    (tmp_path / "rank-2.stderr").write_text("orted: Cannot allocate memory\n")
    assert mpirun.out_of_memory_ranks(str(tmp_path), [0, 1, 2, 3]) == {
        1: "MemoryError: Unable to allocate 16.0 GiB", 2: "orted: Cannot allocate memory"}


def test_stopping_mpirun_ends_the_daemons_that_outlived_it():
    """``emu mpirun``'s timeout must end a run whose daemons outlived mpirun and hold its output open (make soak
    once waited 16 minutes past a 60 s timeout): the group is signalled though its leader has exited."""
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & echo up"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    proc.wait(5)  # "mpirun" exited; its "daemon" keeps the pipe
    started = time.monotonic()
    mpi_run._stop_group(proc)
    assert proc.stdout.read() == ""  # end of file: nobody holds the pipe any more
    assert time.monotonic() - started < 5
