"""The control protocol: framing across pieces, message types checked, ranks learnt from hello, closes seen."""

from __future__ import annotations

import os
import threading

import pytest

from emulator.emulation.agents.agent_protocol import (
    AgentChannel,
    ControlError,
    ControlServer,
    LineBuffer,
    Msg,
    decode,
    encode,
)


def test_a_message_cut_anywhere_arrives_whole_once():
    data = encode(Msg.DONE, rank=3, ops=[[1, 0.5, 0.75]]) + encode(Msg.STEP, rank=3, step=2)
    for cut in range(1, len(data)):
        buf = LineBuffer()
        got = buf.feed(data[:cut]) + buf.feed(data[cut:])
        assert got == [{"type": "done", "rank": 3, "ops": [[1, 0.5, 0.75]]}, {"type": "step", "rank": 3, "step": 2}]


@pytest.mark.parametrize("line", [b"{not json", b"[1, 2]", b'{"type": "bogus"}', b'{"rank": 1}'])
def test_what_is_not_the_protocol_is_refused(line):
    with pytest.raises(ControlError):
        decode(line)


def test_server_learns_ranks_and_reports_a_closed_agent(tmp_path):
    path = os.path.join(tmp_path, "control.sock")
    server = ControlServer(path, 2)
    channels = [AgentChannel(path) for _ in range(2)]
    try:
        for rank, ch in enumerate(channels):
            ch.send(Msg.HELLO, rank=rank)
        seen: list[dict] = []
        while len([m for m in seen if m["type"] == Msg.HELLO]) < 2:
            seen += server.poll(1.0)
        assert sorted(server.conns) == [0, 1]
        server.send_all(Msg.GO, rep=0, start_at=1.5)
        assert channels[1].receive() == {"type": "go", "rep": 0, "start_at": 1.5}
        channels[0].close()
        closed: list[dict] = []
        while not closed:
            closed = [m for m in server.poll(1.0) if m["type"] == Msg.CLOSED]
        assert closed == [{"type": "closed", "rank": 0}]
        assert sorted(server.conns) == [1]
    finally:
        server.close()
        for ch in channels:
            ch.close()


def test_an_agent_sees_the_orchestrator_go_away(tmp_path):
    path = os.path.join(tmp_path, "control.sock")
    server = ControlServer(path, 1)
    ch = AgentChannel(path)
    accepted = threading.Event()
    t = threading.Thread(target=lambda: (server.poll(1.0), accepted.set()))
    t.start()
    t.join()
    server.close()
    with pytest.raises(ControlError, match="closed"):
        ch.receive()
    ch.close()
