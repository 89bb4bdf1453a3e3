"""``python -m jobs head start`` and its ports (issue 64): the ports it
chooses are distinct (every socket held until all are chosen, where a port
bound to 0 and closed could come back: gcs_server and dashboard_agent_http
were once both given 43467 and the head exited 1), a port taken between
choosing it and Ray binding it is read from the head's logs, and such a
start is tried again with fresh ports, saying so in one line. The forced
clash is real: a port of the first attempt is held by the test."""

from __future__ import annotations

import socket
import subprocess

import pytest

from jobs import head as hd
from jobs.config import ConfigError
from jobs.exits import InfraError

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("ray-head")]
"""With the README's Ray section (conftest): one Ray head starting at a time."""


def test_the_ports_chosen_together_are_distinct():
    for _ in range(200):
        ports = hd.free_ports(len(hd.PORT_OPTIONS))
        assert len(set(ports)) == len(hd.PORT_OPTIONS), ports
        for port in ports:  # and free again once chosen: nothing is left holding them
            with socket.socket() as s:
                s.bind((hd.LOOPBACK, port))


# Lines of Ray 2.60's logs, each a server that could not have its port (the
# port: 43467), and lines that are not that.
CLASHES = [
    "ValueError: Ray component dashboard_agent_http is trying to use a port number 43467 that "
    "is used by other components.",
    "[2026-12-07 05:06:14,506 C 10478 10478] (gcs_server) grpc_server.cc:134:  An unexpected "
    "system state has occurred. Check failed: server_ Failed to start the grpc server. The "
    "specified port is 43467. This means that Ray's core components will not be able to "
    "function correctly.",
    "ValueError: Failed to bind to 127.0.0.1:43467 because it's already occupied. You can use "
    "`ray start --dashboard-port ...` or `ray.init(dashboard_port=...)` to select a different "
    "port.",
    "2026-12-07 05:07:40,101\tERROR http_server_agent.py:85 -- Agent port #43467 failed to bind "
    "after 4 attempts.",
    "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 43467): "
    "address already in use",
]
NOT_CLASHES = [
    # The autoscaler monitor's fixed metrics port, held by another cluster: not ours.
    "OSError: [Errno 98] Address already in use",
    "2026-12-07 05:07:31,017\tWARNING http_server_agent.py:79 -- Failed to bind to port 43467 "
    "(attempt 1/4). Retrying in 0.51s. Error: [Errno 98] error while attempting to bind on "
    "address ('127.0.0.1', 43467): address already in use",   # the agent tries again
    "Failed to bind to 127.0.0.1:143467 because it's already occupied.",  # another number
    "2026-12-07 05:07:25,317\tINFO scripts.py:1266 -- This command will now block forever",
]


@pytest.mark.parametrize("line", CLASHES)
def test_a_port_clash_is_read_from_the_log(line):
    log = f"# lamport-lab: log\nsome line\n{line}\nanother line\n"
    assert hd.port_clash(log, [10001, 43467, 43468]) == line
    assert hd.port_clash(log, [10001, 43468]) is None  # not a port chosen for this head


@pytest.mark.parametrize("line", NOT_CLASHES)
def test_what_is_not_a_port_clash(line):
    assert hd.port_clash(line, [43467]) is None


def test_a_start_that_clashes_every_time_gives_up_after_its_attempts(tmp_path, monkeypatch,
                                                                       capsys):
    tries = []

    def clash(*args, **kwargs):
        tries.append(kwargs)
        raise hd._Retry(f"a port was taken before the head's server bound it (dashboard.log: "
                        f"Failed to bind to 127.0.0.1:{len(tries)})")
    monkeypatch.setattr(hd, "_start_once", clash)
    with pytest.raises(InfraError, match=rf"did not start in {hd.START_ATTEMPTS} attempts \(the "
                                         rf"last: a port was taken .* \(dashboard.log: Failed "
                                         rf"to bind to 127.0.0.1:{hd.START_ATTEMPTS}\);"):
        hd.start(tmp_path / "head", num_cpus=2, dashboard="off")
    assert len(tries) == hd.START_ATTEMPTS
    said = capsys.readouterr().err.splitlines()
    assert said == [f"head start: a port was taken before the head's server bound it "
                    f"(dashboard.log: Failed to bind to 127.0.0.1:{n}); starting again with "
                    f"fresh ports (attempt {n + 1} of {hd.START_ATTEMPTS})"
                    for n in range(1, hd.START_ATTEMPTS)]


def test_a_dir_that_is_a_file_is_refused_before_anything(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        hd.start(tmp_path / "f")


def test_a_port_taken_before_the_head_binds_it_is_retried_with_fresh_ports(
        tmp_path, monkeypatch, capsys):
    """The first ``ray start`` finds its dashboard port held by another
    process (a listening socket of this test, bound after the port was
    chosen and before Ray starts): the head exits 1 on it; ``start`` says so
    in one line and starts it again on fresh ports, which comes up."""
    real = subprocess.Popen
    held: list[socket.socket] = []

    class TakeTheDashboardPort(real):
        def __init__(self, argv, **kwargs):
            if "--head" in argv and not held:
                port = int(argv[argv.index("--dashboard-port") + 1])
                s = socket.socket()
                s.bind((hd.LOOPBACK, port))
                s.listen()
                held.append(s)
            super().__init__(argv, **kwargs)

    monkeypatch.setattr(hd.subprocess, "Popen", TakeTheDashboardPort)
    head = tmp_path / "head"
    try:
        state = hd.start(head, num_cpus=2, wait_s=240)
        taken = held[0].getsockname()[1]
        monkeypatch.undo()
        assert state["dashboard"] and not state["dashboard"].endswith(f":{taken}")
        assert hd.status(head)[0]
        said = capsys.readouterr().err.splitlines()
        assert len(said) == 1 and said[0].startswith(
            "head start: a port was taken before the head's server bound it (") and \
            f"{taken}" in said[0] and "attempt 2 of" in said[0], said
        print(f"\nfigure: forced port clash: dashboard port {taken} held, first start exited on "
              f"it, second start up at {state['dashboard']}")
    finally:
        monkeypatch.undo()
        hd.stop(head)
        for s in held:
            s.close()
