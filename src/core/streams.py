"""Stream definitions as the metadata service stores them and every node reads them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spate.core import filtering, limits
from spate.core.errors import InvalidArgument
from spate.core.ids import StreamName

_STREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, slots=True)
class Retention:
    """Whole segments are deleted once any set limit is passed; all None means keep forever."""

    max_age_ms: int | None = None
    max_bytes: int | None = None
    max_messages: int | None = None

    @property
    def infinite(self) -> bool:
        return self.max_age_ms is None and self.max_bytes is None and self.max_messages is None


@dataclass(frozen=True, slots=True)
class StreamConfig:
    name: StreamName
    partitions: int = 1
    replicas: int = 1
    retention: Retention = Retention()
    segment_bytes: int = limits.segment_bytes_default
    filter_size_bytes: int = filtering.SIZE_BYTES_DEFAULT
    """Bytes of each chunk's Bloom filter of filter values (ADR 0016; 16-255)."""

    def validate(self) -> None:
        """Raise InvalidArgument with a message a person can act on."""
        validate_stream_name(self.name)
        if not 1 <= self.partitions <= limits.partitions_max:
            raise InvalidArgument(
                f"partitions must be between 1 and {limits.partitions_max}, got {self.partitions}"
            )
        if not 1 <= self.replicas <= limits.replicas_max:
            raise InvalidArgument(
                f"replicas must be between 1 and {limits.replicas_max}, got {self.replicas}"
            )
        if not limits.segment_bytes_min <= self.segment_bytes <= limits.segment_bytes_max:
            raise InvalidArgument(
                f"segment size must be between {limits.segment_bytes_min} and "
                f"{limits.segment_bytes_max} bytes, got {self.segment_bytes}"
            )
        filtering.validate_size(self.filter_size_bytes)
        r = self.retention
        for label, value in (
            ("max-age", r.max_age_ms),
            ("max-bytes", r.max_bytes),
            ("max-messages", r.max_messages),
        ):
            if value is not None and value <= 0:
                raise InvalidArgument(f"retention {label} must be positive, got {value}")


def validate_stream_name(name: str) -> None:
    if (
        not name
        or len(name.encode()) > limits.stream_name_bytes_max
        or not _STREAM_NAME.match(name)
    ):
        raise InvalidArgument(
            f"invalid stream name {name!r}: use 1-{limits.stream_name_bytes_max} characters from "
            "letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
