"""``emu cluster check`` on two servers made of namespaces (:mod:`tests.integration.cluster_servers`), run in
the head: every check passes; with a wrong key for b, b's ssh fails, the other row still passes, and the
MTU probe leaves no namespace or device behind on either server."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from .cluster_servers import NamespaceServers

pytestmark = pytest.mark.integration


def probe_leftovers(servers: NamespaceServers) -> list[str]:
    """The MTU probe's network namespaces and VXLAN devices still in any server."""
    found = []
    for name in servers.names:
        found += [f"{name}: netns {n}" for n in servers.run(name, ["ip", "netns", "list"]).stdout.split()
                  if n.startswith("efchk-")]
        links = servers.run(name, ["ip", "-o", "link", "show", "type", "vxlan"]).stdout
        found += [f"{name}: {line.split(':')[1].strip()}" for line in links.splitlines() if "efvx" in line]
    return found


def check(servers: NamespaceServers, *args: str) -> subprocess.CompletedProcess[str]:
    """``emu cluster check`` in the head. The servers share this repository's files, so their code digests
    differ only when a file changes between the head's reading and b's: others may be editing the tree while
    this test runs, so a run whose failures are all of the project's code is tried again (twice at most)."""
    for _ in range(3):
        done = servers.emu("a", ["cluster", "check", *args], timeout=600)
        lines = done.stderr.splitlines()
        if done.returncode != 1 or not lines or not all(": project: expected project " in line for line in lines):
            break
    return done


def test_cluster_check_passes_on_namespace_servers_and_names_a_server_ssh_cannot_reach(tmp_path, machine_calibration):
    # The servers share the machine's /var/lib/ef-emu: without a calibration there the check would make one on
    # each server (a Mininet network in each), which is not what this test is about; the fixture installs one.
    with NamespaceServers(str(tmp_path)) as servers:
        done = check(servers, servers.cluster_path)
        print(done.stdout, done.stderr)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("cluster nslab: 2 servers, head a, underlay MTU 9100")
        rows = {line.split()[0]: line for line in lines[2:]}
        assert set(rows) == {"a", "b"} and rows["a"].startswith("a (head)  local")
        assert rows["b"].endswith("ok") and " ok " in rows["b"] and rows["a"].endswith("ok")
        assert done.stderr == ""
        assert probe_leftovers(servers) == []

        as_json = check(servers, servers.cluster_path, "--json")
        assert as_json.returncode == 0, as_json.stderr
        doc = json.loads(as_json.stdout)
        b = doc["servers"][1]
        assert doc["ok"] and b["tunnel"]["ok"] and b["tunnel"]["mtu"] == 9050
        assert b["calibration"]["found"] and not b["calibration"]["made"]
        assert abs(b["clock"]["offset_s"]) <= b["clock"]["uncertainty_s"] + 1e-3  # one machine, one clock

        wrong_key = tmp_path / "wrong_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
        data = yaml.safe_load(open(servers.cluster_path, encoding="utf-8"))
        data["servers"][1]["key"] = str(wrong_key)
        wrong = tmp_path / "wrong.yaml"
        wrong.write_text(yaml.safe_dump(data), encoding="utf-8")
        failed = check(servers, str(wrong))
        print(failed.stdout, failed.stderr)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert failed.stderr.splitlines() == [
            f"emu: server b: ssh: expected a command to run as root@10.77.0.2:22 with the key {wrong_key}, "
            "found exit status 255: root@10.77.0.2: Permission denied (publickey)."]
        rows = {line.split()[0]: line for line in failed.stdout.splitlines()[2:]}
        assert rows["b"].endswith("FAILED (ssh)") and rows["a"].endswith("ok")
        assert probe_leftovers(servers) == [] and servers.leftovers() == []
