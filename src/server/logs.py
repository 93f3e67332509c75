"""Logging of node and gateway processes: text lines, or JSON lines (ADR 0023).

`configure(format, node)` installs one handler on the root logger. In `json` format every record
is one JSON object per line:

    {"ts": "2026-11-26T06:40:01.123Z", "level": "INFO", "logger": "spate.node.manager",
     "node": "n1", "msg": "hosting orders/0 with replicas n1,n2,n3",
     "stream": "orders", "partition": 0}

`node` is the process's node or gateway id on every line; `stream`, `partition`, `link`,
`connection`, `peer`, `user` and `condition` appear when the code that logs passes them as
`extra=log_ids(...)`, so a log pipeline can select one partition's or one link's lines without
parsing messages. Exceptions come as `exc` (the formatted traceback).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

ID_FIELDS = ("stream", "partition", "link", "connection", "peer", "user", "condition")
"""Record attributes copied into a JSON line when the logging call set them (`extra=`)."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_ids(**ids: Any) -> dict[str, Any]:
    """`extra=` for a logging call: the ids that are not None (`log.info(..., extra=log_ids(
    stream=s, partition=p))`)."""
    return {key: value for key, value in ids.items() if value is not None}


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "node": self.node,
            "msg": record.getMessage(),
        }
        for key in ID_FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                line[key] = value if isinstance(value, int | float | bool) else str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str, node: str, level: str) -> None:
    """Install the process's one log handler (stderr) on the root logger."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
