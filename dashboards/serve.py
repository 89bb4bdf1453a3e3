"""``python -m dashboards serve``: a quick local look at a built site.

Loopback only (127.0.0.1), read-only (GET/HEAD of files under the site),
and bounded: it stops after ``--seconds`` (default 15 minutes) or Ctrl-C.
Only files inside the site are served: a path that resolves outside it (a
symbolic link in the site to a file elsewhere) is 404, and folders are not
listed. A ``--port`` that cannot be listened on (in use) is a ValueError
naming it, exit 2.
"""

from __future__ import annotations

import errno
import functools
import http.server
import math
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

LOOPBACK = "127.0.0.1"


class _SiteHandler(http.server.SimpleHTTPRequestHandler):
    """Files inside ``directory`` only; quiet."""

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        pass

    def send_head(self):
        root = os.path.realpath(self.directory)
        real = os.path.realpath(self.translate_path(self.path))
        if os.path.commonpath([root, real]) != root or (
                os.path.isdir(real) and not os.path.isfile(os.path.join(real, "index.html"))):
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def list_directory(self, path):
        self.send_error(404, "File not found")
        return None


MAX_SECONDS = 7 * 86_400.0
"""The longest a look at the site may last (a week): it always ends."""


def check_serve_args(port: int, seconds: float) -> None:
    """ValueError naming the value unless ``port`` is in 0..65535 (0: any
    free one) and ``seconds`` is finite, in (0, MAX_SECONDS]."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be an integer in 0..65535, got {port!r}")
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds)
            and 0 < seconds <= MAX_SECONDS):
        raise ValueError(f"--seconds must be in (0, {MAX_SECONDS:g}] s, got {seconds!r}")


def make_server(site: Path, port: int = 0) -> http.server.ThreadingHTTPServer:
    """A server for ``site`` bound to 127.0.0.1:``port`` (0: any free port)."""
    site = Path(site)
    if not (site / "index.html").is_file():
        raise FileNotFoundError(f"{site} has no index.html; build it first with "
                                f"python -m dashboards build --results DIR --out {site}")
    handler = functools.partial(_SiteHandler, directory=str(site))
    try:
        return http.server.ThreadingHTTPServer((LOOPBACK, port), handler)
    except OSError as err:
        raise ValueError(_port_refusal(port, err)) from None


def _port_refusal(port: int, err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return (f"--port {port}: already in use on {LOOPBACK}; give another port, or 0 for "
                f"any free one")
    return f"--port {port}: cannot listen on {LOOPBACK}:{port} ({err.strerror or err})"


def check_port(port: int) -> None:
    """ValueError naming ``--port`` when nothing can listen on it now (in
    use, or not permitted): checked before a build spends its time."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((LOOPBACK, port))
        except OSError as err:
            raise ValueError(_port_refusal(port, err)) from None


def serve(site: Path, port: int = 8765, seconds: float = 900.0,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve ``site`` on loopback until ``seconds`` pass or Ctrl-C;
    ``on_ready(url)`` is called once it listens."""
    check_serve_args(port, seconds)
    server = make_server(site, port)
    host, bound = server.server_address[:2]
    print(f"serving {site} at http://{host}:{bound}/ for {seconds:.0f} s (Ctrl-C stops)",
          flush=True)
    timer = threading.Timer(seconds, server.shutdown)
    timer.daemon = True
    timer.start()
    if on_ready is not None:
        on_ready(f"http://{host}:{bound}/")
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        timer.cancel()
        server.server_close()
    print("stopped", flush=True)
