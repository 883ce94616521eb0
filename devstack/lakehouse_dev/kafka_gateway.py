"""The embedded broker's secured listener: SASL/SCRAM authentication and TLS in front of tansu.

tansu 0.6.0 (the embedded broker) checks SCRAM credentials only against users kept in
its storage engine, and the only engine built into the bundled binary is in-memory:
a broker started with `--authentication` has no users and nobody can authenticate to
create one (before authentication it answers ApiVersions and the SASL requests only).
So `lakehouse stack up --auth ...` runs tansu on a private loopback port and this
gateway on the public one. Per connection the gateway

  * terminates TLS when given a certificate (security.protocol SSL / SASL_SSL);
  * answers SaslHandshake and SaslAuthenticate itself with Apache Kafka's semantics:
    SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) against salted credentials
    (never the password), error 58 SASL_AUTHENTICATION_FAILED "Authentication failed
    during authentication due to invalid credentials with SASL mechanism ..." for an
    unknown user or a wrong password (no user enumeration), error 33 for a mechanism
    it does not enable, and a closed connection for any other request before
    authentication (ApiVersions is forwarded: clients ask it first);
  * then relays bytes both ways, unchanged: tansu advertises the gateway's address.

Run by `lakehouse_dev.stack`: `python -m lakehouse_dev.kafka_gateway --listen 127.0.0.1:P
--upstream 127.0.0.1:U --credentials FILE [--cert PEM --key PEM]`. The credentials
file (0600) maps user -> mechanism -> {salt, iterations, stored_key, server_key}
(base64), as `scram_credentials()` makes them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import ssl
import struct
from dataclasses import dataclass
from pathlib import Path

from lakehouse.core.errors import ConfigurationError

log = logging.getLogger("lakehouse.kafka_gateway")

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_ITERATIONS = 4096  # Apache Kafka's minimum (and kafka-configs' default)

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
MAX_UNAUTHENTICATED_FRAME = 1 << 20  # a SASL exchange is a few hundred bytes
RELAY_CHUNK = 1 << 18


class GatewayError(ConfigurationError):
    """The gateway cannot start: bad credentials file, certificate or address."""


# ---------------------------------------------------------------------------- SCRAM

def scram_credentials(password: str, mechanisms=tuple(MECHANISMS), iterations: int = SCRAM_ITERATIONS) -> dict:
    """Salted SCRAM credentials of `password` per mechanism (base64 salt, stored_key, server_key)."""
    out = {}
    for mechanism in mechanisms:
        digest = MECHANISMS[mechanism]
        salt = secrets.token_bytes(32)
        salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", digest)
        out[mechanism] = {
            "salt": base64.b64encode(salt).decode(),
            "iterations": iterations,
            "stored_key": base64.b64encode(hashlib.new(digest, client_key).digest()).decode(),
            "server_key": base64.b64encode(hmac.digest(salted, b"Server Key", digest)).decode(),
        }
    return out


class AuthenticationFailed(Exception):
    """The client's SCRAM exchange failed; the message is for the gateway log, never the client."""


def _saslname(value: str) -> str:
    return value.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str) -> dict[str, str]:
    attrs = {}
    for part in message.split(","):
        if len(part) >= 2 and part[1] == "=":
            attrs.setdefault(part[0], part[2:])
    return attrs


class ScramServer:
    """One SCRAM exchange: `first(client_first)` -> server-first, `final(client_final)` -> server-final.

    Raises AuthenticationFailed for an unknown user, a wrong proof or a malformed message.
    """

    def __init__(self, mechanism: str, users: dict):
        self.mechanism = mechanism
        self.digest = MECHANISMS[mechanism]
        self.users = users
        self.username: str | None = None

    def first(self, message: bytes) -> bytes:
        text = message.decode("utf-8", "replace")
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            raise AuthenticationFailed("malformed client-first message (or channel binding asked for)")
        self.gs2_header = f"{parts[0]},{parts[1]},"
        self.client_first_bare = parts[2]
        attrs = _attributes(self.client_first_bare)
        if "n" not in attrs or "r" not in attrs:
            raise AuthenticationFailed("client-first message without user name or nonce")
        self.username = _saslname(attrs["n"])
        authzid = parts[1][2:] if parts[1].startswith("a=") else ""
        if authzid and _saslname(authzid) != self.username:
            raise AuthenticationFailed(f"user {self.username!r} asked to act as {authzid!r}")
        credential = self.users.get(self.username, {}).get(self.mechanism)
        if credential is None:
            raise AuthenticationFailed(f"unknown user {self.username!r} for {self.mechanism}")
        self.credential = credential
        self.nonce = attrs["r"] + base64.b64encode(secrets.token_bytes(18)).decode()
        self.server_first = f"r={self.nonce},s={credential['salt']},i={credential['iterations']}"
        return self.server_first.encode()

    def final(self, message: bytes) -> bytes:
        text = message.decode("utf-8", "replace")
        without_proof, sep, proof = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        if not sep or attrs.get("r") != self.nonce:
            raise AuthenticationFailed(f"user {self.username!r}: nonce mismatch or no proof")
        if attrs.get("c") != base64.b64encode(self.gs2_header.encode()).decode():
            raise AuthenticationFailed(f"user {self.username!r}: channel binding mismatch")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        stored_key = base64.b64decode(self.credential["stored_key"])
        try:
            client_proof = base64.b64decode(proof, validate=True)
        except ValueError:
            raise AuthenticationFailed(f"user {self.username!r}: proof is not base64") from None
        signature = hmac.digest(stored_key, auth_message, self.digest)
        if len(client_proof) != len(signature):
            raise AuthenticationFailed(f"user {self.username!r}: proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(client_proof, signature))
        if not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), stored_key):
            raise AuthenticationFailed(f"user {self.username!r}: wrong password")
        server_key = base64.b64decode(self.credential["server_key"])
        return b"v=" + base64.b64encode(hmac.digest(server_key, auth_message, self.digest))


# ---------------------------------------------------------------------------- Kafka framing

def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _put_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@dataclass
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    body: bytes  # after the request header

    @classmethod
    def parse(cls, frame: bytes) -> "Request":
        api_key, api_version, correlation_id, client_id_len = struct.unpack_from(">hhih", frame, 0)
        pos = 10 + max(client_id_len, 0)
        if api_key == SASL_AUTHENTICATE and api_version >= 2:  # flexible: header tagged fields
            count, pos = _uvarint(frame, pos)
            for _ in range(count):
                _tag, pos = _uvarint(frame, pos)
                size, pos = _uvarint(frame, pos)
                pos += size
        return cls(api_key, api_version, correlation_id, frame[pos:])


def _response(correlation_id: int, body: bytes, flexible: bool = False) -> bytes:
    header = struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(header) + len(body)) + header + body


def handshake_response(request: Request, enabled: list[str]) -> tuple[bytes, str | None]:
    """SaslHandshake v0/v1 answer and the mechanism chosen (None when not enabled here)."""
    (length,) = struct.unpack_from(">h", request.body, 0)
    mechanism = request.body[2:2 + length].decode("utf-8", "replace")
    error = 0 if mechanism in enabled else UNSUPPORTED_SASL_MECHANISM
    body = struct.pack(">hi", error, len(enabled))
    for name in enabled:
        body += struct.pack(">h", len(name)) + name.encode()
    return _response(request.correlation_id, body), (mechanism if error == 0 else None)


def auth_bytes(request: Request) -> bytes:
    if request.api_version >= 2:
        size, pos = _uvarint(request.body, 0)
        return request.body[pos:pos + size - 1]
    (size,) = struct.unpack_from(">i", request.body, 0)
    return request.body[4:4 + max(size, 0)]


def authenticate_response(request: Request, error: int, message: str | None, payload: bytes) -> bytes:
    """SaslAuthenticate v0-v2 answer (v1+ carry session_lifetime_ms 0: no re-authentication)."""
    if request.api_version >= 2:
        encoded = None if message is None else message.encode()
        body = struct.pack(">h", error)
        body += _put_uvarint(0) if encoded is None else _put_uvarint(len(encoded) + 1) + encoded
        body += _put_uvarint(len(payload) + 1) + payload + struct.pack(">q", 0) + b"\x00"
        return _response(request.correlation_id, body, flexible=True)
    body = struct.pack(">h", error)
    if message is None:
        body += struct.pack(">h", -1)
    else:
        encoded = message.encode()
        body += struct.pack(">h", len(encoded)) + encoded
    body += struct.pack(">i", len(payload)) + payload
    if request.api_version >= 1:
        body += struct.pack(">q", 0)
    return _response(request.correlation_id, body)


async def _read_frame(reader: asyncio.StreamReader, limit: int | None = None) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if size < 10 or (limit is not None and size > limit):
        raise ConnectionError(f"frame of {size} bytes before authentication")
    return await reader.readexactly(size)


# ---------------------------------------------------------------------------- the gateway

class _Throttle:
    """Logs a repeated warning (a client retrying with a wrong password) once per `every` seconds."""

    def __init__(self, every: float = 30.0):
        self.every = every
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, key: str, message: str, *args) -> None:
        now = asyncio.get_running_loop().time()
        last, suppressed = self._last.get(key, (float("-inf"), 0))
        if now - last < self.every:
            self._last[key] = (last, suppressed + 1)
            return
        self._last[key] = (now, 0)
        log.warning(message + (f" ({suppressed} more like it since the last report)" if suppressed else ""), *args)


class Gateway:
    """Accepts clients on `listen`, authenticates them (when `users` is given) and relays to `upstream`."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], users: dict | None,
                 tls: ssl.SSLContext | None = None):
        self.listen = listen
        self.upstream = upstream
        self.users = users
        self.tls = tls
        self.enabled = sorted({m for creds in (users or {}).values() for m in creds if m in MECHANISMS})
        self._throttle = _Throttle()

    async def serve(self, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self._client, *self.listen, ssl=self.tls, limit=RELAY_CHUNK,
                                            reuse_address=True)
        log.info("listening on %s:%d (%s), relaying to %s:%d", *self.listen,
                 ("SASL " + "/".join(self.enabled) if self.users is not None else "no SASL")
                 + (" over TLS" if self.tls else ""), *self.upstream)
        async with server:
            await stop.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=RELAY_CHUNK)
            if self.users is not None and not await self._authenticate(reader, writer, up_reader, up_writer, peer):
                return
            await asyncio.gather(self._relay(reader, up_writer), self._relay(up_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError, struct.error,
                IndexError, UnicodeError) as exc:
            log.debug("connection from %s ended: %s", peer, exc)
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    async def _authenticate(self, reader, writer, up_reader, up_writer, peer) -> bool:
        """The SASL exchange; True once the client is authenticated, False when it was refused."""
        mechanism: str | None = None
        scram: ScramServer | None = None
        while True:
            frame = await _read_frame(reader, MAX_UNAUTHENTICATED_FRAME)
            request = Request.parse(frame)
            if request.api_key == API_VERSIONS:
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                response = await _read_frame(up_reader)
                writer.write(struct.pack(">i", len(response)) + response)
                await writer.drain()
            elif request.api_key == SASL_HANDSHAKE and mechanism is None:
                answer, mechanism = handshake_response(request, self.enabled)
                writer.write(answer)
                await writer.drain()
                if mechanism is None:
                    log.warning("refused %s: SASL mechanism not enabled (enabled: %s)", peer, self.enabled)
                    return False
                if request.api_version == 0:  # v0 sends raw SASL tokens next: not supported here
                    log.warning("refused %s: SaslHandshake v0 is not supported", peer)
                    return False
                scram = ScramServer(mechanism, self.users or {})
            elif request.api_key == SASL_AUTHENTICATE and scram is not None:
                try:
                    if not hasattr(scram, "server_first"):
                        writer.write(authenticate_response(request, 0, None, scram.first(auth_bytes(request))))
                        await writer.drain()
                        continue
                    final = scram.final(auth_bytes(request))
                except AuthenticationFailed as exc:
                    self._throttle.warning(f"{mechanism} {exc}", "authentication failed for %s (%s): %s",
                                           peer, mechanism, exc)
                    writer.write(authenticate_response(
                        request, SASL_AUTHENTICATION_FAILED,
                        f"Authentication failed during authentication due to invalid credentials with "
                        f"SASL mechanism {mechanism}", b""))
                    await writer.drain()
                    return False
                writer.write(authenticate_response(request, 0, None, final))
                await writer.drain()
                log.debug("authenticated %s as %r (%s)", peer, scram.username, mechanism)
                return True
            else:
                log.warning("closed %s: request with api key %d before authentication", peer, request.api_key)
                if request.api_key == SASL_AUTHENTICATE:
                    writer.write(authenticate_response(request, ILLEGAL_SASL_STATE,
                                                       "SaslAuthenticate before SaslHandshake", b""))
                    await writer.drain()
                return False

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                chunk = await reader.read(RELAY_CHUNK)
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
        finally:
            if writer.can_write_eof():
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass
            else:
                writer.close()


def load_users(path: Path) -> dict:
    """The credentials file as `scram_credentials()` wrote it, per user. Raises GatewayError."""
    try:
        users = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GatewayError(f"cannot read the SCRAM credentials file {path}: {exc}") from None
    if not isinstance(users, dict) or not users:
        raise GatewayError(f"{path}: no users")
    return users


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2+) for the certificate chain `cert` and its private key `key`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise GatewayError(f"cannot load the TLS certificate {cert} / key {key}: {exc}") from None
    return context


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakehouse_dev.kafka_gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, type=_address, help="HOST:PORT clients connect to")
    parser.add_argument("--upstream", required=True, type=_address, help="HOST:PORT of the broker")
    parser.add_argument("--credentials", type=Path, help="SCRAM credentials file (omit: TLS only, no SASL)")
    parser.add_argument("--cert", type=Path, help="PEM certificate chain (with --key: TLS)")
    parser.add_argument("--key", type=Path, help="PEM private key of --cert")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if bool(args.cert) != bool(args.key):
        parser.error("--cert and --key go together")
    if not args.credentials and not args.cert:
        parser.error("nothing to do: give --credentials, --cert/--key or both")
    gateway = Gateway(args.listen, args.upstream, load_users(args.credentials) if args.credentials else None,
                      tls_context(args.cert, args.key) if args.cert else None)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await gateway.serve(stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    raise SystemExit(main())
