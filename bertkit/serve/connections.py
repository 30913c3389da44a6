"""Connections: deadlines for a request's headers and for its answer, and a connection limit that keeps the
server reachable.

uvicorn bounds what it can: idle keep-alive connections (`timeout_keep_alive`,
--keep-alive-s), requests in progress (`limit_concurrency`: beyond it a request is answered
503) and the size of a request's headers (h11's 16 KB `h11_max_incomplete_event_size`;
httptools' own parser limits). Three things it leaves open, all about slow clients (slowloris):

- **No deadline for the headers.** A client that sends half a request line holds a socket (a
  file descriptor) for as long as it likes. So when a connection opens, and again after each
  answer, the next request's headers must be complete within --header-timeout-s, else the
  connection is closed. A request whose headers have arrived is not affected (its body has
  --body-timeout-s, `bertkit.serve.requests.read_json`).
- **Descriptors run out before any limit is reached.** At `ulimit -n 256`, 300 connections
  that never finish their headers use every descriptor; the event loop (libuv, under uvloop)
  then accepts each new connection and closes it at once, so nobody is served until the
  header deadline frees some. So the number of open connections has a ceiling below the
  descriptors the process may open (`capacity`: --max-connections, or RLIMIT_NOFILE less the
  descriptors the server held when it started and a spare share for bursts of accepts), and
  when a new connection reaches it, the connection that has waited longest for a request's
  headers (an idle keep-alive one, or one still sending them) is closed to make room, as nginx
  reuses its idle connections when worker_connections run out. A legitimate client sends its
  headers as soon as it connects, so it is answered; a slow one gives way. When every open
  connection is in the middle of a request, nothing is closed and the newcomer's request is
  answered 503 (uvicorn's `limit_concurrency`, set to one above the ceiling).
- **No deadline for the answer.** A client that sends requests and never reads the answers
  keeps each one in the server's memory: the transport buffers what the kernel will not take,
  and uvicorn has no send timeout (docs/serving.md has the measurement). When the transport's
  buffer goes over its high-water mark it tells the protocol (`pause_writing`); if, in a whole
  --send-timeout-s after that or after the client last read some of it, the client reads
  nothing, the connection is aborted and the buffer freed, as nginx's
  send_timeout closes it (a slow reader is served). Abort, because close() would wait for the
  buffer to be sent.

The protocol objects of both of uvicorn's parsers (h11, httptools) set `cycle` when a
request's headers are complete, and call `on_response_complete` after each answer: a
connection is waiting for headers while its cycle is None or answered. The waiting ones are
kept in the order they began to wait (a dict keeps insertion order), so the oldest is first.
"""

from __future__ import annotations

import os
import resource
import time

SPARE_SHARE = 8  # 1/8 of the descriptors (at least SPARE_MIN) stay free for the accepts of one burst,
SPARE_MIN = 32  # made before the event loop runs the callbacks that close connections to make room
LOG_EVERY_S = 10.0  # at most one line per this many seconds about connections closed to make room


def descriptors_in_use() -> int:
    """The file descriptors this process holds now (model and index files, the event loop's own)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: macOS lists them in /dev/fd
        return len(os.listdir("/dev/fd"))


def capacity(max_connections: int, held: int) -> int:
    """Most open connections: --max-connections, or fewer when the descriptor limit (RLIMIT_NOFILE, read now:
    an operator may change it on a running process) less the `held` ones and a spare share is lower."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return max_connections
    spare = max(SPARE_MIN, soft // SPARE_SHARE)
    return max(1, min(max_connections, soft - held - spare))


class SendDeadline:
    """Mixed into uvicorn's protocol before it: a connection whose client reads nothing of its answer for
    `send_timeout_s` while the transport's buffer is over its high-water mark is aborted."""

    send_timeout_s = 30.0
    _paused = None  # a token, set while writing is paused

    def pause_writing(self) -> None:  # the transport's buffer is over its high-water mark: the client lags
        super().pause_writing()
        self._paused = paused = object()
        self._arm_send_deadline(paused)

    def resume_writing(self) -> None:
        self._paused = None
        super().resume_writing()

    def _arm_send_deadline(self, paused) -> None:
        self.loop.call_later(self.send_timeout_s, self._send_deadline, paused, self.transport.get_write_buffer_size())

    def _send_deadline(self, armed_with, unsent: int) -> None:
        if self._paused is not armed_with:
            return
        if self.transport.get_write_buffer_size() < unsent:  # it read some meanwhile: slow, not stalled
            self._arm_send_deadline(armed_with)
        else:  # abort, not close: close() waits for the buffer to be sent, which this client never lets happen
            self.transport.abort()


def guarded(protocol: type, header_timeout_s: float, max_connections: int, held: int, log=None,
            send_timeout_s: float = 30.0) -> type:
    """A subclass of uvicorn's HTTP `protocol` whose connections must send each request's headers within
    `header_timeout_s`, read their answers (`SendDeadline`), and of which at most `capacity(max_connections,
    held)` stay open: the one that has waited longest for headers makes room (`log(line)` is told)."""
    waiting = {}  # the connections waiting for a request's headers -> None, the longest waiting first
    closed = {"count": 0, "told": float("-inf")}

    def make_room(newcomer, ceiling: int) -> None:
        excess = len(newcomer.connections) - ceiling
        for conn in list(waiting) if excess > 0 else ():
            if excess <= 0:
                break
            if conn is not newcomer and conn.waiting_for_headers() and not conn.transport.is_closing():
                conn.transport.close()  # its descriptor is freed now; connection_lost follows, maybe after
                conn.connections.discard(conn)  # the newcomer's request is counted: so uncount the closed one now
                waiting.pop(conn, None)
                excess -= 1
                closed["count"] += 1
        now = time.monotonic()
        if closed["count"] and log is not None and now - closed["told"] >= LOG_EVERY_S:
            log(f"bertkit serve: {closed['count']} connection(s) that had not sent a request's headers were "
                f"closed to make room (at most {ceiling} open: --max-connections {max_connections}, or the "
                f"descriptor limit, ulimit -n {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, less {held} "
                "held and a spare share)")
            closed["count"], closed["told"] = 0, now

    class Guarded(SendDeadline, protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            waiting[self] = None
            ceiling = capacity(max_connections, held)
            self.limit_concurrency = ceiling + 1  # uvicorn's 503 when, after make_room, all are busy
            make_room(self, ceiling)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            waiting.pop(self, None)
            waiting[self] = None  # waits again, from now: the last in line
            self._arm_header_deadline()

        def connection_lost(self, exc) -> None:
            waiting.pop(self, None)
            super().connection_lost(exc)

        def waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_header_deadline(self) -> None:
            self.loop.call_later(header_timeout_s, self._header_deadline, self.cycle)

        def _header_deadline(self, armed_with) -> None:
            if self.cycle is armed_with and self.waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

    Guarded.send_timeout_s = send_timeout_s
    Guarded.__name__ = f"Guarded{protocol.__name__}"
    return Guarded
