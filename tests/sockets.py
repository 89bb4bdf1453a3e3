"""The listening sockets of a set of processes, from /proc (tests of what the
embedded cluster and the Ray head expose)."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def listening_sockets(pids) -> list[tuple[int, str, str, int]]:
    """(pid, proto, address, port) of every listening TCP socket and bound
    UDP socket the processes hold (from /proc/net and their fds)."""
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[int(link[8:-1])] = pid
    found = []
    for proto, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6),
                          ("udp", socket.AF_INET), ("udp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inode = int(fields[9])
            if inode not in inodes or (proto.startswith("tcp") and fields[3] != "0A"):
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((inodes[inode], proto, socket.inet_ntop(family, raw), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    return address in ("127.0.0.1", "::1", "::ffff:127.0.0.1") or address.startswith("127.")
