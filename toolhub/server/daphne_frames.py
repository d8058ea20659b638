"""Daphne's WebSocket protocol, framing a text once for every socket it goes to.

A run's feed hands the *same* text to every stream of the run in this process
(apps/invocations/fanout.py); each stream sends it as a standard ASGI
`websocket.send`. Daphne then encodes the text, builds the frame and copies it once per
socket. A server's frames are never masked (RFC 6455, 5.1), so the bytes are the same on
every socket: `FramingWebSocketProtocol` takes them from its factory's small cache of
recent frames and writes them as they are. This is what autobahn's prepared messages are
for (`prepareMessage`, "for Broadcast/PubSub"); the frame is built the same way.

Anything the plain path would treat differently goes the plain path: a binary message,
a socket not open, per-message compression, fragmentation, autobahn's own send queue or
frame logging, a message over the payload limit (which raises there, as before).

The frame is then sent at once (`write_now`). Twisted's `transport.write` only buffers:
it registers the socket with the event loop for writing, sends on the next turn of the
loop, and unregisters it once the buffer is empty. With a thousand sockets per event
that was two `epoll_ctl` calls and a loop callback per socket, about as much as the send
itself. When nothing waits in the transport's buffer, the frame goes to the socket
straight away, as asyncio's own transports do; only what the socket does not take is
buffered, and Twisted sends it as before. Frames keep their order: once anything is
buffered, every later frame is buffered behind it.

A feed hands a subscriber a quick call's start and result together; sent at once, they
would be two packets for the client to read. Inside `send_batches.together()` a socket's
frames are held in Twisted's own buffer (without registering the socket) and sent joined
when the stretch ends, so whatever else is written meanwhile queues behind them.

Closing: autobahn sends only 1000 and 3000-4999 (RFC 6455's codes for applications);
Daphne handed it a consumer's 1011 as given, and autobahn raised "invalid close code
1011" (a traceback, and no close frame for the client). `serverClose` maps such a code
into the private range (`daphne_close_code`: 1001-1015 to 4001-4015, as 1008 is 4008).
And the protocols open in this process are known (`open_streams`), so that a stopping
server can close each with a code and a reason before Daphne cancels their consumers
(`close_streams`, toolhub/server/draining.py): the reactor's end drops every connection
without one, which clients saw as 1006.
"""

from __future__ import annotations

import asyncio
from typing import Any

from autobahn.websocket.protocol import PreparedMessage
from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
from twisted.internet import tcp

from toolhub.server import send_batches

# The cache keeps the most recent texts' frames within both bounds; a text over
# MAX_CACHED_BYTES is framed for its socket alone (as Daphne would).
MAX_CACHED_FRAMES = 64
MAX_CACHED_BYTES = 8 * 1024 * 1024


class FrameCache:
    """Recent texts and their frames, oldest first, within a count and a byte budget."""

    def __init__(self, max_frames: int = MAX_CACHED_FRAMES, max_bytes: int = MAX_CACHED_BYTES):
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self.frames: dict[str, bytes] = {}
        self.size = 0

    def frame(self, text: str) -> bytes:
        frame = self.frames.get(text)
        if frame is not None:
            return frame
        frame = text_frame(text.encode())
        if len(frame) <= self.max_bytes:
            self.frames[text] = frame
            self.size += len(frame)
            while self.size > self.max_bytes or len(self.frames) > self.max_frames:
                self.size -= len(self.frames.pop(next(iter(self.frames))))
        return frame


def text_frame(payload: bytes) -> bytes:
    """One unmasked, unfragmented, uncompressed text frame (a server's frame)."""
    return PreparedMessage(payload, isBinary=False, applyMask=False, doNotCompress=True).payloadHybi


def daphne_close_code(code: int | None) -> int | None:
    """`code`, or the code in 4000-4999 that stands for it when autobahn would refuse it."""
    if code is None or code == 1000 or 3000 <= code <= 4999:
        return code
    if 1001 <= code <= 1015:
        return 3000 + code
    return 4011  # anything else: the server's failure (1011's private twin)


# WebSocket protocols open in this process (handshake done, not yet closed).
open_streams: set[FramingWebSocketProtocol] = set()
_all_closed: list[asyncio.Future[None]] = []


class FramingWebSocketProtocol(WebSocketProtocol):
    factory: FramingWebSocketFactory

    def onOpen(self) -> None:
        open_streams.add(self)
        super().onOpen()

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        open_streams.discard(self)
        if not open_streams:
            for waiting in _all_closed:
                if not waiting.done():
                    waiting.set_result(None)
            _all_closed.clear()
        super().onClose(wasClean, code, reason)

    def handle_reply(self, message: dict[str, Any]) -> None:
        if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
            # Daphne's own drops the reason; autobahn sends it (at most 123 bytes).
            reason = message.get("reason") or None
            self.sendClose(code=daphne_close_code(message.get("code")) or 1000, reason=reason)
            return
        super().handle_reply(message)

    def serverClose(self, code: int | None = None) -> None:
        super().serverClose(code=daphne_close_code(code))

    def serverSend(self, content: Any, binary: bool = False) -> None:
        if binary or not self._plain_text_frames():
            super().serverSend(content, binary)
            return
        frame = self.factory.frames.frame(content)
        payload_len = len(frame) - _header_len(frame)
        if 0 < self.maxMessagePayloadSize < payload_len:
            super().serverSend(content, binary)  # raises PayloadExceededError, as before
            return
        write_now(self.transport, frame)
        stats = self.trafficStats
        stats.outgoingWebSocketMessages += 1
        stats.outgoingWebSocketFrames += 1
        stats.outgoingOctetsAppLevel += payload_len
        stats.outgoingOctetsWebSocketLevel += payload_len
        stats.outgoingOctetsWireLevel += len(frame)

    def _plain_text_frames(self) -> bool:
        """Whether a text message goes out as one plain frame written straight away."""
        return (
            self.state == self.STATE_OPEN
            and self._perMessageCompress is None
            and not self.autoFragmentSize
            and not self.send_queue
            and not self.logFrames
            and not self.logOctets
            and not self.trackedTimings
        )


def write_now(transport: Any, data: bytes) -> None:
    """Send `data` on a plain TCP connection now if nothing is waiting before it; what the
    socket does not take (or anything on another transport: TLS, a UNIX socket, a test's)
    goes through Twisted's buffer.

    Inside `send_batches.together()` the bytes are held instead: appended to Twisted's
    buffer without registering the socket, and sent joined when the stretch ends
    (`_send_held`). Anything else written meanwhile (a close frame, another task's frame)
    lands behind them in the same buffer and registers the socket as usual, so nothing
    overtakes them and nothing waits on the stretch but the held bytes themselves."""
    if _plain_tcp(transport) and transport.offset == len(transport.dataBuffer):
        if send_batches.hold(transport, _send_held):
            transport._tempDataBuffer.append(data)
            transport._tempDataLen += len(data)
            return
        if not transport._tempDataBuffer:
            sent = transport.writeSomeData(data)
            if isinstance(sent, int):  # else the connection is lost: Twisted's write finds it
                if sent == len(data):
                    return
                data = data[sent:]
    transport.write(data)


def _plain_tcp(transport: Any) -> bool:
    return bool(
        type(transport) is tcp.Server
        and not transport.TLS
        and transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnected
    )


def _send_held(transport: Any) -> None:
    """Send a socket's buffer at the end of a stretch, as `write_now` sends one frame."""
    if not transport._tempDataBuffer:
        return  # Twisted sent it meanwhile (something else registered the socket)
    if not (_plain_tcp(transport) and transport.offset == len(transport.dataBuffer)):
        if transport.connected:
            transport.startWriting()  # closing, or a partial send before: Twisted's turn
        return
    data = b"".join(transport._tempDataBuffer)
    transport._tempDataBuffer, transport._tempDataLen = [], 0
    write_now(transport, data)


def _header_len(frame: bytes) -> int:
    length = frame[1] & 0x7F
    return 2 if length < 126 else 4 if length == 126 else 10


class FramingWebSocketFactory(WebSocketFactory):
    protocol = FramingWebSocketProtocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames = FrameCache()


def close_streams(code: int, reason: str) -> asyncio.Future[None]:
    """Send every open stream a close frame with `code` and `reason`; done once each has
    closed (its client answered the close, or autobahn's close timeout dropped it)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if not open_streams:
        done.set_result(None)
        return done
    _all_closed.append(done)
    for protocol in list(open_streams):
        if protocol.state == protocol.STATE_OPEN:
            protocol.sendClose(code=code, reason=reason)
    return done


def install_daphne_frames() -> None:
    """Make Daphne's server build `FramingWebSocketProtocol`s (idempotent)."""
    from daphne import server

    server.WebSocketFactory = FramingWebSocketFactory
