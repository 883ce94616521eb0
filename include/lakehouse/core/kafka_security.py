"""Kafka authentication and TLS failures, surfaced as soon as librdkafka sees them.

librdkafka retries a refused SASL login or a failed TLS handshake forever and reports
it only through `error_cb`; a blocking call (list_topics, a describe future, consume)
meanwhile waits out its whole timeout and ends in a vague "transport failure". The
helpers here watch `error_cb` while waiting in short slices, so a wrong password or CA
ends the call within a fraction of a second with `KafkaAuthError`, whose message names
the broker, the protocol, the mechanism and the user (never the password) and says what
to check.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from lakehouse.core import config
from lakehouse.core.errors import KafkaAuthError

AUTH_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
TLS_CODES = frozenset({KafkaError._SSL})
SLICE_S = 0.1  # how long a blocking call waits before error_cb is looked at again


def describe(conf: dict) -> str:
    """Where and how `conf` connects, for messages: servers, protocol, mechanism and user."""
    protocol = str(conf.get("security.protocol", "PLAINTEXT")).upper()
    parts = [protocol]
    if protocol.startswith("SASL"):
        mechanism = conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "GSSAPI"
        parts.append(str(mechanism))
        if conf.get("sasl.username"):
            parts.append(f"user {conf['sasl.username']!r}")
    return f"{conf.get('bootstrap.servers')} ({', '.join(parts)})"


def _scrub(text: str, conf: dict) -> str:
    """`text` with every secret value of `conf` replaced by *** (librdkafka never quotes them;
    this makes sure a broker's message cannot either)."""
    for key, value in conf.items():
        if config.is_sensitive_kafka_property(str(key)) and isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def auth_error(conf: dict, err: KafkaError | str) -> KafkaAuthError:
    """The KafkaAuthError for librdkafka error `err` of a client configured with `conf`."""
    detail = _scrub(err.str() if isinstance(err, KafkaError) else str(err), conf)
    servers = conf.get("bootstrap.servers")
    if isinstance(err, KafkaError) and err.code() in TLS_CODES:
        return KafkaAuthError(
            f"the TLS handshake with Kafka at {describe(conf)} failed: {detail}. Check ssl.ca.location "
            f"(LAKEHOUSE_KAFKA_SSL_CA_LOCATION, or the Kafka connection's extra): it must hold the CA that "
            f"signed the broker's certificate, and that certificate must name the host in bootstrap.servers "
            f"({servers}); check security.protocol too (SSL or SASL_SSL for a TLS listener).")
    mechanism = conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "GSSAPI"
    user = conf.get("sasl.username")
    return KafkaAuthError(
        f"Kafka at {servers} refused the credentials: SASL {mechanism} authentication of user {user!r} over "
        f"{str(conf.get('security.protocol', 'PLAINTEXT')).upper()} failed ({detail}). Check sasl.username, "
        f"sasl.password and sasl.mechanism against the user the cluster has (LAKEHOUSE_KAFKA_SASL_USERNAME / "
        f"LAKEHOUSE_KAFKA_SASL_PASSWORD / LAKEHOUSE_KAFKA_SASL_MECHANISM, or the `lakehouse_kafka` Airflow "
        f"connection; for the embedded broker `lakehouse stack status` shows its mechanism and user). "
        f"The password is not shown.")


class ErrorWatch:
    """An `error_cb` that keeps librdkafka's authentication and TLS errors for `check()`.

    Other errors go on to `chained` (a callback the configuration already had), if any.
    """

    def __init__(self, conf: dict, chained: Callable[[KafkaError], Any] | None = None):
        self.conf = {k: v for k, v in conf.items() if k != "error_cb"}
        self.chained = chained
        self.errors: list[KafkaError] = []

    def __call__(self, err: KafkaError) -> None:
        if err.code() in AUTH_CODES or err.code() in TLS_CODES:
            self.errors.append(err)
        elif self.chained is not None:
            self.chained(err)

    def check(self) -> None:
        """Raises KafkaAuthError when the broker refused the credentials or the TLS handshake failed."""
        if self.errors:
            raise auth_error(self.conf, self.errors[0])


def watched(conf: dict) -> tuple[dict, ErrorWatch]:
    """`conf` with an ErrorWatch as its error_cb (chaining any it had), and the watch."""
    watch = ErrorWatch(conf, conf.get("error_cb"))
    return {**conf, "error_cb": watch}, watch


def wait_future(future: concurrent.futures.Future, client, watch: ErrorWatch, timeout: float):
    """`future.result()` of an AdminClient request, polling `client` every SLICE_S so that a refused
    login raises KafkaAuthError at once; after `timeout` seconds it waits for the request's own end.

    Raises what the future raises (KafkaException), or KafkaAuthError.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return future.result(timeout=SLICE_S)
        except concurrent.futures.TimeoutError:
            client.poll(0)
            watch.check()
    try:
        return future.result()
    except KafkaException:
        client.poll(0)
        watch.check()
        raise


def list_topics(client, watch: ErrorWatch, timeout: float, topic: str | None = None):
    """`client.list_topics()` that fails with KafkaAuthError as soon as the login is refused.

    Raises KafkaException (the last attempt's) when the cluster does not answer within `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.05, min(0.25, remaining)))
        except KafkaException:
            client.poll(0)
            watch.check()
            if time.monotonic() + 0.05 >= deadline:
                raise
