"""A loopback TCP proxy a test can freeze: the server seems to hang while its socket stays open."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from contextlib import suppress
from types import TracebackType


class FreezableProxy:
    """Forwards 127.0.0.1:``port`` to ``host``:``target_port`` until :meth:`freeze`.

    Frozen, it still accepts connections and reads what clients send, but forwards nothing
    either way and holds it back: to a client, the server has stopped answering after the
    connection was made (as a server under SIGSTOP, or a network that drops packets, looks).
    :meth:`thaw` delivers what was held back, in order, and forwards again; so a write sent
    while frozen is applied once the proxy thaws, as a frozen server would apply it on waking.
    """

    def __init__(self, host: str, target_port: int) -> None:
        self.target = (host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._frozen = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        held: list[tuple[socket.socket, bytes]] = []
        ended = False
        try:
            while not self._closed:
                if not ended:
                    for key, _ in selector.select(timeout=0.05):
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(65536)
                        if not data:
                            ended = True  # deliver what is held first, as a server would
                            break
                        held.append((key.data, data))
                elif self._frozen.is_set():
                    time.sleep(0.05)
                    continue
                if self._frozen.is_set():
                    continue
                for destination, data in held:
                    with suppress(OSError):
                        destination.sendall(data)
                held.clear()
                if ended:
                    return
        except OSError:
            return
        finally:
            selector.close()
            for s in (client, upstream):
                with suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._closed = True
        self.thaw()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def __enter__(self) -> FreezableProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
