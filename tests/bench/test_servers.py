"""bench/servers.py: a port answers for our server only when our process listens on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bench.servers import free_port, listens_on

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


def test_listens_on_tells_the_process_that_holds_the_listening_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listens_on(os.getpid(), port) is True
            assert listens_on(other.pid, port) is False  # another process answering on "our" port
        finally:
            other.kill()
            other.wait()
    assert listens_on(os.getpid(), port) is False  # closed


def test_a_bound_but_not_listening_port_is_not_listened_on():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        assert listens_on(os.getpid(), port) is False
