"""Daphne frames a text once for every socket it goes to (toolhub/server/daphne_frames.py).

The frames are checked with another WebSocket implementation's parser (the `websockets`
client's) for each header length; against Daphne's own protocol on an in-memory transport
(the same bytes on the wire, the same traffic counts, the same refusals, the same order
behind autobahn's send queue); and end to end: streams of one run on a real Daphne
receive byte-identical texts live, and the same events replayed. (An event is at most
about 41 kB, the argument and result limits, so the 10-byte header is only reached by the
parser test.)
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from autobahn.exception import Disconnected, PayloadExceededError
from daphne.ws_protocol import WebSocketFactory
from twisted.internet import tcp
from twisted.internet.protocol import Protocol
from twisted.internet.testing import StringTransport
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader
from websockets.sync.client import ClientConnection

from tests.conftest import allow
from tests.streams.conftest import EVENT_TIMEOUT, KeyClient, nothing_arrives, open_ws
from toolhub.server import send_batches
from toolhub.server.daphne_frames import FrameCache, FramingWebSocketFactory, text_frame, write_now


def parsed(frame: bytes) -> Frame:
    """The frame as a client reads it (a client refuses a masked frame from a server)."""
    reader = StreamReader()
    reader.feed_data(frame)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        assert reader.at_eof(), "bytes left over after the frame"
        return done.value
    raise AssertionError("the frame is incomplete")


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_a_frame_reads_back_as_one_final_text_frame_of_the_text(size):
    text = ("é✓🙂x" * size)[:size]
    frame = parsed(text_frame(text.encode()))
    assert frame.opcode == Opcode.TEXT and frame.fin
    assert not (frame.rsv1 or frame.rsv2 or frame.rsv3)
    assert frame.data.decode() == text


def test_the_same_text_is_framed_once():
    cache = FrameCache()
    text = json.dumps({"seq": 1, "type": "tool_call_result"})
    first = cache.frame(text)
    assert cache.frame(text) is first
    assert cache.frame("".join([text[:5], text[5:]])) is first  # an equal text, another object


def test_the_cache_keeps_the_most_recent_frames_within_its_count():
    cache = FrameCache(max_frames=3, max_bytes=1 << 20)
    texts = [f"event {n}" for n in range(5)]
    for text in texts:
        cache.frame(text)
    assert list(cache.frames) == texts[2:]
    assert cache.size == sum(len(frame) for frame in cache.frames.values())


def test_the_cache_keeps_the_most_recent_frames_within_its_bytes():
    cache = FrameCache(max_frames=100, max_bytes=1000)
    for n in range(4):
        cache.frame(str(n) * 300)  # 304 bytes framed (a 4-byte header)
    assert list(cache.frames) == ["1" * 300, "2" * 300, "3" * 300]
    assert cache.size == 912


def test_a_text_larger_than_the_whole_cache_is_framed_but_not_kept():
    cache = FrameCache(max_frames=10, max_bytes=1000)
    cache.frame("kept")
    big = "b" * 5000
    assert parsed(cache.frame(big)).data.decode() == big
    assert list(cache.frames) == ["kept"]


# ---------------------------------------------------------------- against Daphne's own protocol


def opened(factory_class: type[WebSocketFactory]) -> tuple[Any, StringTransport]:
    """A protocol of the factory on an in-memory transport, past its handshake."""
    protocol = factory_class(None, server="toolhub-test").buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.state = protocol.STATE_OPEN  # what a completed handshake leaves
    protocol.client_addr = ["127.0.0.1", 50000]
    return protocol, transport


SENDS: list[tuple[Any, bool]] = [
    ("short", False),
    ("é✓🙂" * 40, False),  # 126..65535 bytes: a 2-byte length
    ("short", False),  # the same text again: from the cache
    (b"\x00\x01binary", True),  # binary: Daphne's own path
    ("x" * 70000, False),  # over 65535 bytes: an 8-byte length
]


def test_it_writes_exactly_what_daphne_writes_and_counts_the_same_traffic():
    framing, framing_wire = opened(FramingWebSocketFactory)
    plain, plain_wire = opened(WebSocketFactory)
    for content, binary in SENDS:
        framing.serverSend(content, binary)
        plain.serverSend(content, binary)
        assert framing_wire.value() == plain_wire.value()
    assert vars(framing.trafficStats) == vars(plain.trafficStats)
    assert list(framing.factory.frames.frames) == ["short", "é✓🙂" * 40, "x" * 70000]


@pytest.mark.parametrize("state", ["STATE_CLOSING", "STATE_CLOSED"])
def test_a_socket_no_longer_open_refuses_a_send_as_daphne_does(state):
    for factory_class in (FramingWebSocketFactory, WebSocketFactory):
        protocol, transport = opened(factory_class)
        protocol.state = getattr(protocol, state)
        with pytest.raises(Disconnected):
            protocol.serverSend("late", False)
        assert transport.value() == b""


def test_a_text_over_the_payload_limit_is_refused_as_daphne_does():
    for factory_class in (FramingWebSocketFactory, WebSocketFactory):
        protocol, transport = opened(factory_class)
        protocol.maxMessagePayloadSize = 100
        with pytest.raises(PayloadExceededError):
            protocol.serverSend("y" * 101, False)
        protocol.serverSend("y" * 100, False)
        assert parsed(transport.value()).data == b"y" * 100


def test_a_text_behind_frames_queued_by_autobahn_waits_its_turn_as_with_daphne():
    """autobahn queues a send while earlier ones wait in its own queue (sync or chopped
    sends); a text sent meanwhile joins that queue, behind them, on both protocols."""
    wires = []
    for factory_class in (FramingWebSocketFactory, WebSocketFactory):
        protocol, transport = opened(factory_class)
        protocol.send_queue.extend([(b"queued-1", False), (b"queued-2", False)])
        protocol.serverSend("then this", False)
        wires.append((transport.value(), [data for data, _ in protocol.send_queue]))
    assert wires[0] == wires[1]
    written, still_queued = wires[0]
    assert written + b"".join(still_queued) == b"queued-1queued-2" + text_frame(b"then this")


# ---------------------------------------------------------------- through a real Daphne


def texts(ws: ClientConnection, count: int) -> list[str]:
    """The next `count` messages exactly as they arrived."""
    received = []
    for _ in range(count):
        message = ws.recv(timeout=EVENT_TIMEOUT)
        assert isinstance(message, str), "an event arrived as a binary frame"
        received.append(message)
    return received


@pytest.mark.django_db(transaction=True)
@pytest.mark.server
def test_live_streams_of_a_run_receive_the_same_texts_and_a_replay_the_same_events(server, acme):
    """Events from about 0.3 kB to 30 kB, of ASCII and escaped text."""
    allow(acme.tenant, "test__big_output")
    client = KeyClient(server, acme.key)
    headers = {"Authorization": f"Bearer {acme.key}"}
    sent = ["short", "é✓🙂 " * 250]
    path = "/ws/v1/runs/run-frames/"
    with open_ws(server, path, headers) as first, open_ws(server, path, headers) as second:
        nothing_arrives(first, 0.3)
        for n, text in enumerate(sent):
            client.invoke(
                "test__echo", args={"text": text}, runId="run-frames", toolCallId=f"frames-{n}"
            )
        client.invoke(
            "test__big_output", args={"size": 30000}, runId="run-frames", toolCallId="frames-big"
        )
        live = texts(first, 6)
        assert texts(second, 6) == live
        nothing_arrives(first)
    with open_ws(server, path + "?after=0", headers) as late:
        replayed = texts(late, 6)  # encoded again from the database

    events: list[dict[str, Any]] = [json.loads(text) for text in live]
    # The same events; not always the same text: PostgreSQL's jsonb keeps keys in its own order.
    assert [json.loads(text) for text in replayed] == events
    assert [event["seq"] for event in events] == [1, 2, 3, 4, 5, 6]
    assert [event["type"] for event in events] == ["tool_call_start", "tool_call_result"] * 3
    assert all(event["ok"] for event in events[1::2]), events[1::2]
    assert [event["args"]["text"] for event in events[0:4:2]] == sent
    assert [event["result"]["text"] for event in events[1:4:2]] == sent
    assert events[5]["result"] == {"blob": "x" * 30000}


# ------------------------------------------------------------ sent at once (write_now)


class Reactor:
    """What a tcp.Server asks of its reactor: whether it registered for writing."""

    def __init__(self) -> None:
        self.writers: list[object] = []
        self.registrations = 0

    def addWriter(self, writer: object) -> None:  # Twisted's names
        if writer not in self.writers:  # Twisted asks again while registered
            self.registrations += 1
            self.writers.append(writer)

    def removeWriter(self, writer: object) -> None:
        if writer in self.writers:
            self.writers.remove(writer)

    def addReader(self, reader: object) -> None:
        pass

    def removeReader(self, reader: object) -> None:
        pass


@pytest.fixture
def connection() -> Any:
    """A real Twisted TCP server connection over a real socket pair, and the peer."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reactor = Reactor()
    transport = tcp.Server(ours, Protocol(), ("127.0.0.1", 1), None, 1, reactor)  # type: ignore[arg-type]
    yield transport, peer, reactor
    ours.close()
    peer.close()


def read_all(peer: socket.socket, transport: Any, size: int) -> bytes:
    """What the peer reads, running Twisted's buffered writes as the loop would."""
    got = b""
    peer.settimeout(0.05)
    while len(got) < size:
        if transport in transport.reactor.writers:
            transport.doWrite()
        try:
            got += peer.recv(65536)
        except TimeoutError:
            continue
    return got


def test_a_frame_goes_to_the_socket_at_once_without_registering_for_writing(connection):
    transport, peer, reactor = connection
    frame = text_frame(b'{"seq":1}')
    write_now(transport, frame)
    assert (
        reactor.registrations == 0 and transport.dataBuffer == b"" and not transport._tempDataBuffer
    )
    assert peer.recv(100) == frame


def test_what_the_socket_does_not_take_is_buffered_and_later_frames_queue_behind_it(connection):
    transport, peer, reactor = connection
    big = text_frame(b"x" * 1_000_000)  # far past both socket buffers
    small = [text_frame(json.dumps({"seq": n}).encode()) for n in range(3)]
    write_now(transport, big)
    assert reactor.registrations == 1  # the rest waits for the loop
    for frame in small:
        write_now(transport, frame)  # behind the rest of `big`, never before it
    expected = big + b"".join(small)
    assert read_all(peer, transport, len(expected)) == expected
    write_now(transport, small[0])  # the buffer is empty again: at once
    assert reactor.registrations == 1
    assert peer.recv(100) == small[0]


def test_a_write_to_a_closed_peer_is_left_to_twisted(connection):
    transport, peer, reactor = connection
    peer.close()
    for _ in range(3):  # the first may still be taken by the kernel
        write_now(transport, text_frame(b"lost"))
    assert reactor.registrations >= 1  # Twisted's write found the connection lost


def test_other_transports_keep_twisteds_write():
    transport = StringTransport()
    write_now(transport, b"abc")
    assert transport.value() == b"abc"


# ------------------------------------------------- held together (send_batches)


def frames_of(*texts: str) -> list[bytes]:
    return [text_frame(text.encode()) for text in texts]


def nothing_readable(peer: socket.socket) -> bool:
    peer.settimeout(0.02)
    try:
        peer.recv(1)
    except TimeoutError:
        return True
    return False


def test_a_sockets_frames_in_a_stretch_leave_joined_at_its_end_without_registering(connection):
    transport, peer, reactor = connection
    start, result = frames_of('{"seq":1}', '{"seq":2}')
    with send_batches.together():
        write_now(transport, start)
        write_now(transport, result)
        assert nothing_readable(peer)  # held
    assert reactor.registrations == 0 and not transport._tempDataBuffer
    assert peer.recv(100) == start + result  # one send: one read
    write_now(transport, start)  # after the stretch: at once again
    assert peer.recv(100) == start


def test_a_write_made_during_a_stretch_lands_behind_the_held_frames(connection):
    transport, peer, reactor = connection
    start, result = frames_of('{"seq":1}', '{"seq":2}')
    close = b"\x88\x02\x03\xe8"  # a close frame, as autobahn writes it
    with send_batches.together():
        write_now(transport, start)
        transport.write(close)  # Twisted's write: behind, and it registers the socket
        write_now(transport, result)
    assert reactor.registrations == 1  # the close frame's write registered the socket
    expected = start + close + result
    assert read_all(peer, transport, len(expected)) == expected


def test_a_connection_closed_during_a_stretch_still_sends_the_held_frames_first(connection):
    transport, peer, reactor = connection
    start, result = frames_of('{"seq":1}', '{"seq":2}')
    with send_batches.together():
        write_now(transport, start)
        write_now(transport, result)
        transport.loseConnection()
    assert transport in reactor.writers  # Twisted sends, then closes
    assert read_all(peer, transport, len(start + result)) == start + result


def test_a_held_batch_the_socket_does_not_take_is_buffered_and_later_frames_follow(connection):
    transport, peer, reactor = connection
    big, small = text_frame(b"x" * 1_000_000), text_frame(b'{"seq":3}')
    with send_batches.together():
        write_now(transport, big)
    assert reactor.registrations == 1  # the rest waits for the loop
    write_now(transport, small)
    expected = big + small
    assert read_all(peer, transport, len(expected)) == expected


def test_a_held_batch_to_a_closed_peer_is_left_to_twisted(connection):
    transport, peer, reactor = connection
    peer.close()
    for _ in range(3):  # the first may still be taken by the kernel
        with send_batches.together():
            write_now(transport, text_frame(b"lost"))
    assert reactor.registrations >= 1  # Twisted's write found the connection lost


def test_each_socket_of_a_stretch_gets_its_own_frames():
    pairs = [socket.socketpair() for _ in range(2)]
    reactor = Reactor()
    transports: list[Any] = []
    for ours, _ in pairs:
        ours.setblocking(False)
        transports.append(tcp.Server(ours, Protocol(), ("127.0.0.1", 1), None, 1, reactor))
    try:
        with send_batches.together():
            for n, transport in enumerate(transports):
                write_now(transport, text_frame(f'{{"to":{n}}}'.encode()))
                write_now(transport, text_frame(b'{"seq":2}'))
        for n, (_, peer) in enumerate(pairs):
            assert peer.recv(100) == text_frame(f'{{"to":{n}}}'.encode()) + text_frame(b'{"seq":2}')
        assert reactor.registrations == 0
    finally:
        for ours, peer in pairs:
            ours.close()
            peer.close()


def test_other_transports_are_not_held():
    transport = StringTransport()
    with send_batches.together():
        write_now(transport, b"abc")
        assert transport.value() == b"abc"


def test_stretches_nest_and_a_failing_send_does_not_keep_the_others(caplog):
    sent: list[str] = []

    def send(key: str) -> None:
        if key == "broken":
            raise RuntimeError("no socket")
        sent.append(key)

    assert not send_batches.hold("a", send)  # no stretch open
    with send_batches.together():
        assert send_batches.hold("a", send) and send_batches.hold("broken", send)
        with send_batches.together():
            assert send_batches.hold("b", send) and send_batches.hold("a", send)
        assert sent == []  # the inner end is not the end
    assert sent == ["a", "b"]  # each key once, in the order first held
    assert "could not send a held batch" in caplog.text


async def test_a_stretch_holds_only_its_own_tasks_sends():
    seen: list[tuple[str, bool]] = []
    inside = asyncio.Event()
    done = asyncio.Event()

    async def other() -> None:
        await inside.wait()
        seen.append(("other", send_batches.hold("other", lambda key: None)))
        done.set()

    task = asyncio.ensure_future(other())
    with send_batches.together():
        seen.append(("mine", send_batches.hold("mine", lambda key: None)))
        inside.set()
        await done.wait()
    await task
    assert seen == [("mine", True), ("other", False)]
