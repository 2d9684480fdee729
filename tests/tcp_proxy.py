"""A TCP proxy that a test can cut and restore: the dependency behind it (Redis, PostgreSQL)
goes away and comes back without touching the shared server the other tests use."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target`. While down, it drops every open connection and
    closes new ones at once, as a crashed server would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._up = True
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def down(self) -> None:
        with self._lock:
            self._up = False
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    def up(self) -> None:
        with self._lock:
            self._up = True

    def close(self) -> None:
        self.down()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                up = self._up
            if not up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)


@contextlib.contextmanager
def tcp_proxy(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy((host, port))
    try:
        yield proxy
    finally:
        proxy.close()
