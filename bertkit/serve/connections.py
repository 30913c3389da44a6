"""Connections: a deadline for a request's headers, on top of uvicorn's own limits.

uvicorn bounds what it can: idle keep-alive connections (`timeout_keep_alive`,
--keep-alive-s), connections and requests in progress (`limit_concurrency`,
--max-connections: beyond it a request is answered 503) and the size of a request's
headers (h11's 16 KB `h11_max_incomplete_event_size`; httptools' own parser limits).
It has no deadline for the headers themselves: a client that opens a connection and
sends half a request line holds a socket (a file descriptor) for as long as it likes,
and a few hundred such clients exhaust the process's descriptors (slowloris). So
`with_header_deadline` wraps uvicorn's HTTP protocol class: when a connection opens,
and again after each answer, the next request's headers must be complete within
--header-timeout-s, else the connection is closed. A request whose headers have arrived
is not affected (its body has --body-timeout-s, `bertkit.serve.requests.read_json`).

The protocol objects of both of uvicorn's parsers (h11, httptools) set `cycle` when a
request's headers are complete, and call `on_response_complete` after each answer: a
deadline that finds the same finished (or no) cycle it was armed with closes the connection.
"""

from __future__ import annotations


def with_header_deadline(protocol: type, seconds: float) -> type:
    """A subclass of uvicorn's HTTP `protocol` whose connections must send each request's headers in time."""

    class HeaderDeadline(protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def _arm_header_deadline(self) -> None:
            self.loop.call_later(seconds, self._header_deadline, self.cycle)

        def _header_deadline(self, armed_with) -> None:
            waiting = self.cycle is armed_with and (armed_with is None or armed_with.response_complete)
            if waiting and not self.transport.is_closing():
                self.transport.close()

    HeaderDeadline.__name__ = f"HeaderDeadline{protocol.__name__}"
    return HeaderDeadline
