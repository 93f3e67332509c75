"""The connector's options: parsed and checked once, at planning time, with no Spark import.

Spark hands a data source its options as a case-insensitive map of strings (keys arrive
lower-cased, every value a string); a direct call (a test, a benchmark, a wrapper) may pass any
spelling, so `read_options` and `write_options` fold the keys themselves (`folded`): option
names are case-insensitive everywhere, as Spark's are. Everything here is a plain frozen
dataclass, so it pickles to the executors as it is. Unknown options and contradictory ones
raise `OptionError` naming the option: a typo must not silently read from `latest`
(research/pyspark.md §3, "a bug we hit").

Names follow Spark's Kafka source where they mean the same (docs/spark.md has the table).
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from spate.spark import limits


class OptionError(ValueError):
    """An option is unknown, malformed or contradicts another; the message names it."""


EARLIEST = -2
"""In offsets JSON, as in Kafka's: the partition's first retained offset."""
LATEST = -1
"""In offsets JSON: the partition's end (the offset the next message will get)."""

OffsetSpec = str | dict[str, dict[str, int]]
"""`earliest`, `latest`, or {stream: {partition: offset | EARLIEST | LATEST}}."""

_COMMON = frozenset(
    {
        "endpoints",
        "username",
        "password",
        "timeoutms",
        "tlscafile",
        "tlscertfile",
        "tlskeyfile",
        "tlshostnameverification",
        "_testfailmarker",
    }
)
_READ = _COMMON | {
    "stream",
    "superstream",
    "startingoffsets",
    "startingtimestamp",
    "endingoffsets",
    "endingtimestamp",
    "maxmessagespertrigger",
    "minpartitions",
    "maxrecordsperpartition",
    "failondataloss",
    "credit",
    "bulkread",
    "metadatarefreshintervalms",
    "maxbytesperbatch",
}
_STREAM_ONLY = frozenset({"maxmessagespertrigger"})
_BATCH_ONLY = frozenset({"endingoffsets", "endingtimestamp"})
_WRITE = _COMMON | {"stream", "window", "producername"}
_NAMES = {
    name.lower(): name
    for name in (
        "endpoints",
        "username",
        "password",
        "timeoutMs",
        "tlsCaFile",
        "tlsCertFile",
        "tlsKeyFile",
        "tlsHostnameVerification",
        "stream",
        "superStream",
        "startingOffsets",
        "startingTimestamp",
        "endingOffsets",
        "endingTimestamp",
        "maxMessagesPerTrigger",
        "minPartitions",
        "maxRecordsPerPartition",
        "failOnDataLoss",
        "credit",
        "bulkRead",
        "metadataRefreshIntervalMs",
        "maxBytesPerBatch",
        "window",
        "producerName",
        "_testFailMarker",
    )
}


def spelled(key: str) -> str:
    """The documented spelling of a (lower-cased) option name."""
    return _NAMES.get(key.lower(), key)


@dataclass(frozen=True)
class Tls:
    """How `amqps://` endpoints are verified. Paths, not an `ssl.SSLContext`: the options are
    pickled to the executors, which build the context (`ssl_context`) — so the files must be
    readable at the same path on every executor, like Kafka's truststore location."""

    ca_file: str | None
    """PEM CAs to trust (None: the system's)."""
    cert_file: str | None
    """A client certificate (PEM) for listeners that ask for one, with `key_file`."""
    key_file: str | None
    check_hostname: bool


@functools.cache
def ssl_context(tls: Tls) -> ssl.SSLContext:
    """The context for `tls`, built once per process. Raises OptionError naming the option
    whose file cannot be read or used."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as error:
        raise OptionError(f"option tlsCaFile: {tls.ca_file!r}: {error}") from None
    if tls.cert_file is not None:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as error:
            raise OptionError(
                f"options tlsCertFile/tlsKeyFile: {tls.cert_file!r}, {tls.key_file!r}: {error}"
            ) from None
    if not tls.check_hostname:
        context.check_hostname = False
    return context


@dataclass(frozen=True)
class Connection:
    """Where and how to connect: every endpoint as an AMQP URL, tried in turn."""

    urls: tuple[str, ...]
    user: str | None
    password: str | None
    timeout_s: float
    tls: Tls | None = None
    """Set when an endpoint is `amqps://`."""

    def ssl_context(self) -> ssl.SSLContext | None:
        return None if self.tls is None else ssl_context(self.tls)


@dataclass(frozen=True)
class ReadOptions:
    connection: Connection
    streams: tuple[str, ...] | None
    """The streams to read (None: `super_stream`'s partition streams, found at planning)."""
    super_stream: str | None
    starting: OffsetSpec
    starting_timestamp_ms: int | None
    ending: OffsetSpec
    ending_timestamp_ms: int | None
    max_messages_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    credit: int
    metadata_refresh_ms: int
    test_fail_marker: str | None
    bulk_read: bool = True
    """Ask for bulk deliveries (ADR 0029): many messages per transfer, cut into Arrow columns
    with vectorised work; false reads message by message as before."""
    batch_bytes_max: int = limits.batch_bytes_default
    """maxBytesPerBatch: an Arrow batch a reading task yields holds at most this many bytes of
    messages (and at most `limits.rows_per_batch` rows); a larger message travels alone."""


@dataclass(frozen=True)
class WriteOptions:
    connection: Connection
    stream: str
    window: int
    producer_name: str | None
    """A prefix for the producer names the writer derives (default: the query id / write id)."""
    test_fail_marker: str | None


def folded(options: Mapping[str, str]) -> dict[str, str]:
    """The options with their names lower-cased (Spark's rule: `startingOffsets`,
    `startingoffsets` and `STARTINGOFFSETS` are one option), values as strings. One name
    given twice in different spellings with different values is an error naming it."""
    out: dict[str, str] = {}
    given: dict[str, str] = {}
    for key, value in options.items():
        name, text = str(key).lower(), str(value)
        if name in out and out[name] != text:
            raise OptionError(
                f"option {spelled(name)} is given twice, as {given[name]!r} = {out[name]!r} "
                f"and {key!r} = {text!r} (option names are case-insensitive)"
            )
        out[name], given[name] = text, str(key)
    return out


def _get(options: Mapping[str, str], name: str) -> str | None:
    """`options` are `folded`."""
    return options.get(name.lower())


def _int(options: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    text = _get(options, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name}: {text!r} is not an integer") from None
    if not low <= value <= high:
        raise OptionError(f"option {name}: {value} is outside {low}..{high}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise OptionError(f"option {name}: {text!r} is not true or false")
    return text.lower() == "true"


def parse_endpoints(text: str | None) -> tuple[str, ...]:
    """`host:port`, `amqp://host:port` or `amqps://host:port` (TLS), comma-separated, to AMQP
    URLs."""
    if not text or not text.strip():
        raise OptionError(
            "option endpoints is required: comma-separated host:port, amqp://host:port or "
            "amqps://host:port (TLS) of any Spate nodes or gateways"
        )
    urls = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        url = item if "://" in item else f"amqp://{item}"
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname or port is None:
            raise OptionError(
                f"option endpoints: {item!r} is not host:port, amqp://host:port or "
                "amqps://host:port"
            )
        urls.append(f"{parts.scheme}://{parts.hostname}:{port}")
    if len(urls) > limits.endpoints_max:
        raise OptionError(f"option endpoints: more than {limits.endpoints_max} endpoints")
    return tuple(urls)


def _connection(options: Mapping[str, str]) -> Connection:
    user, password = _get(options, "username"), _get(options, "password")
    if (user is None) != (password is None):
        raise OptionError("options username and password go together (SASL PLAIN)")
    timeout_ms = _int(options, "timeoutMs", 100, 3_600_000) or limits.timeout_ms_default
    urls = parse_endpoints(_get(options, "endpoints"))
    return Connection(urls, user, password, timeout_ms / 1000, _tls(options, urls))


def _tls(options: Mapping[str, str], urls: tuple[str, ...]) -> Tls | None:
    """Checked at planning (the files are read here, as the executors will)."""
    ca, cert, key = (_get(options, n) for n in ("tlsCaFile", "tlsCertFile", "tlsKeyFile"))
    check_hostname = _bool(options, "tlsHostnameVerification", True)
    given = [
        name
        for name, value in (("tlsCaFile", ca), ("tlsCertFile", cert), ("tlsKeyFile", key))
        if value is not None
    ] + ([] if _get(options, "tlsHostnameVerification") is None else ["tlsHostnameVerification"])
    if not any(url.startswith("amqps://") for url in urls):
        if given:
            raise OptionError(
                f"option {given[0]} is for amqps:// endpoints, and option endpoints has none"
            )
        return None
    if (cert is None) != (key is None):
        raise OptionError("options tlsCertFile and tlsKeyFile go together (a client certificate)")
    tls = Tls(ca, cert, key, check_hostname)
    ssl_context(tls)
    return tls


def _unknown(options: Mapping[str, str], known: frozenset[str], what: str) -> None:
    for key in options:
        if key.lower() not in known:
            raise OptionError(
                f"unknown option {key!r} for a Spate {what}; known: "
                + ", ".join(sorted(spelled(k) for k in known if not k.startswith("_")))
            )


def parse_offsets(name: str, text: str | None, default: str) -> OffsetSpec:
    """`earliest` | `latest` | Kafka's JSON: {"stream": {"0": 23, "1": -2}} (-2 earliest,
    -1 latest)."""
    text = (text or default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        raise OptionError(
            f'option {name}: {text!r} is not earliest, latest or JSON like {{"orders": '
            '{"0": 23, "1": -2}}'
        ) from None
    if not isinstance(given, dict) or not given:
        raise OptionError(f"option {name}: expected a JSON object of streams, got {text!r}")
    spec: dict[str, dict[str, int]] = {}
    for stream, partitions in given.items():
        if not isinstance(partitions, dict):
            raise OptionError(
                f"option {name}: stream {stream!r} maps to {partitions!r}, not an object of "
                "partition -> offset"
            )
        spec[stream] = {}
        for partition, offset in partitions.items():
            if not str(partition).isdigit():
                raise OptionError(f"option {name}: partition {partition!r} of {stream!r}")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(
                    f"option {name}: {stream}/{partition}: {offset!r} is not an offset, "
                    "-2 (earliest) or -1 (latest)"
                )
            spec[stream][str(int(partition))] = offset
    return spec


def _timestamp(options: Mapping[str, str], name: str) -> int | None:
    """Milliseconds since the epoch (Kafka's form), or an ISO-8601 time (UTC if no zone)."""
    text = _get(options, name)
    if text is None:
        return None
    if text.strip().isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise OptionError(
            f"option {name}: {text!r} is neither milliseconds since the epoch nor ISO-8601"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _streams(options: Mapping[str, str]) -> tuple[tuple[str, ...] | None, str | None]:
    text, super_stream = _get(options, "stream"), _get(options, "superStream")
    if (text is None) == (super_stream is None):
        raise OptionError(
            "exactly one of the options stream (a stream, or several comma-separated) and "
            "superStream is required"
        )
    if text is None:
        return None, super_stream
    streams = tuple(s.strip() for s in text.split(",") if s.strip())
    if not streams or len(set(streams)) != len(streams):
        raise OptionError(f"option stream: {text!r} names no stream, or one twice")
    return streams, None


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check and parse a reader's options (Kafka's defaults: a stream starts at `latest`,
    a batch read covers `earliest` to `latest`). Option names in any case."""
    _unknown(options, _READ, "streaming source" if streaming else "batch source")
    options = folded(options)
    for key in _BATCH_ONLY if streaming else _STREAM_ONLY:
        if _get(options, key) is not None:
            raise OptionError(
                f"option {spelled(key)} is for "
                + ("batch reads, not streaming queries" if streaming else "streaming queries")
            )
    streams, super_stream = _streams(options)
    if _get(options, "startingOffsets") is not None and _get(options, "startingTimestamp"):
        raise OptionError("options startingOffsets and startingTimestamp contradict: set one")
    if _get(options, "endingOffsets") is not None and _get(options, "endingTimestamp"):
        raise OptionError("options endingOffsets and endingTimestamp contradict: set one")
    starting = parse_offsets(
        "startingOffsets", _get(options, "startingOffsets"), "latest" if streaming else "earliest"
    )
    ending = parse_offsets("endingOffsets", _get(options, "endingOffsets"), "latest")
    if not streaming and starting == "latest":
        raise OptionError("option startingOffsets: a batch read cannot start at latest")
    if ending == "earliest":
        raise OptionError("option endingOffsets: a read cannot end at earliest")
    if isinstance(ending, dict) and any(v == EARLIEST for p in ending.values() for v in p.values()):
        raise OptionError("option endingOffsets: -2 (earliest) is not an ending offset")
    for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        if isinstance(spec, dict) and streams is not None:
            extra = set(spec) - set(streams)
            if extra:
                raise OptionError(f"option {name} names streams not read: {sorted(extra)}")
    bulk_read = _bool(options, "bulkRead", True)
    return ReadOptions(
        connection=_connection(options),
        streams=streams,
        super_stream=super_stream,
        starting=starting,
        starting_timestamp_ms=_timestamp(options, "startingTimestamp"),
        ending=ending,
        ending_timestamp_ms=_timestamp(options, "endingTimestamp"),
        max_messages_per_trigger=_int(options, "maxMessagesPerTrigger", 1, 2**62),
        min_partitions=_int(options, "minPartitions", 1, limits.tasks_per_batch_max),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", 1, 2**62),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        credit=_int(options, "credit", 1, limits.credit_max)
        or (limits.bulk_credit_default if bulk_read else limits.credit_default),
        metadata_refresh_ms=(
            _int(options, "metadataRefreshIntervalMs", 0, 600_000)
            if _get(options, "metadataRefreshIntervalMs") is not None
            else limits.metadata_refresh_ms_default
        )
        or 0,
        test_fail_marker=_get(options, "_testFailMarker"),
        bulk_read=bulk_read,
        batch_bytes_max=_int(options, "maxBytesPerBatch", 1, limits.batch_bytes_max)
        or limits.batch_bytes_default,
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check and parse a writer's options (names in any case)."""
    _unknown(options, _WRITE | {"checkpointlocation", "path"}, "sink")
    options = folded(options)
    stream = _get(options, "stream")
    if not stream or "," in stream:
        raise OptionError("option stream is required for writing: the one stream to write to")
    name = _get(options, "producerName")
    if name is not None and not 0 < len(name.encode()) <= limits.producer_prefix_bytes_max:
        raise OptionError(
            f"option producerName: 1 to {limits.producer_prefix_bytes_max} UTF-8 bytes"
        )
    return WriteOptions(
        connection=_connection(options),
        stream=stream,
        window=_int(options, "window", 1, limits.window_max) or limits.window_default,
        producer_name=name,
        test_fail_marker=_get(options, "_testFailMarker"),
    )
