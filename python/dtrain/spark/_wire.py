"""The frames that run_elastic's driver, tasks and proxies exchange (dtrain/spark/_agents.py), and
how a connection is authenticated before anything else is read from it.

A frame: one kind byte, a 4-byte big-endian length, the payload. Whoever accepts a connection
sends a random challenge; the other side answers with HMAC-SHA256(the job's token, challenge) and
only then says who it is. A connection that answers wrong, late, or with a frame larger than its
step allows is dropped, and counts for nothing: strangers never reach the job."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!cI")
CHALLENGE_BYTES = 32
AUTH_TIMEOUT_S = 5.0
CONTROL_LIMIT = 1 << 20  # a hello, a job's argv and variables, a list of tasks
DATA_LIMIT = 1 << 30  # a pickled function, a result


class WireError(ConnectionError):
    """The peer closed the connection, or sent what this side does not accept."""


def send(sock: socket.socket, kind: bytes, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(kind, len(payload)) + payload)


def send_json(sock: socket.socket, kind: bytes, value: Any) -> None:
    send(sock, kind, json.dumps(value).encode())


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise WireError("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, limit: int = CONTROL_LIMIT) -> tuple[bytes, bytes]:
    kind, size = _HEADER.unpack(_exactly(sock, _HEADER.size))
    if size > limit:
        raise WireError(f"a frame of {size} bytes, above the {limit} this step accepts")
    return kind, _exactly(sock, size)


def recv_json(sock: socket.socket, expected: bytes) -> dict[str, Any]:
    kind, payload = recv(sock)
    if kind != expected:
        raise WireError(f"a frame of kind {kind!r} where {expected!r} was expected")
    try:
        value = json.loads(payload)
    except ValueError as e:
        raise WireError(f"a malformed message: {e}") from e
    if not isinstance(value, dict):
        raise WireError("a message that is not an object")
    return dict(value)


def _answer(token: str, challenge: bytes) -> bytes:
    return hmac.new(token.encode(), challenge, hashlib.sha256).digest()


def _keep_alive(sock: socket.socket) -> None:
    """A member's connection waits without a timeout once it is authenticated (a worker may be
    silent for hours): TCP keepalive probes end the wait within about 11 s of its host vanishing
    without a word (no FIN, no RST)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def accept_member(sock: socket.socket, token: str) -> dict[str, Any]:
    """The accepting side: challenges the peer, then returns its hello. Raises WireError (or
    OSError, on a timeout) for a stranger."""
    _keep_alive(sock)
    sock.settimeout(AUTH_TIMEOUT_S)
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    send(sock, b"c", challenge)
    kind, answer = recv(sock, limit=64)
    if kind != b"a" or not hmac.compare_digest(answer, _answer(token, challenge)):
        raise WireError("a wrong answer to the challenge")
    hello = recv_json(sock, b"h")
    sock.settimeout(None)
    return hello


def join(address: tuple[str, int], token: str, hello: dict[str, Any],
         timeout: float = AUTH_TIMEOUT_S) -> socket.socket:
    """The connecting side: connects, answers the challenge and says ``hello``."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        _keep_alive(sock)
        kind, challenge = recv(sock, limit=64)
        if kind != b"c" or len(challenge) != CHALLENGE_BYTES:
            raise WireError(f"{address[0]}:{address[1]} is not one of this job's")
        send(sock, b"a", _answer(token, challenge))
        send_json(sock, b"h", hello)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock
