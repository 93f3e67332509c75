"""pysyncobj's transport interface (pysyncobj/transport.py) in memory, for metadata voters wired
by hand in tests: what a voter sends goes to `post(source, target, message)` (a copy through
pickle, as a real wire hands over); the test delivers it through `on_message` when it likes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

Post = Callable[[str, str, dict[str, Any]], None]


class MemoryWire:
    ready = True

    def __init__(self, address: str, post: Post) -> None:
        self.address, self.post = address, post
        self.on_message: Callable[[object, dict[str, Any]], None] | None = None
        self.on_connected: Callable[[object], None] | None = None

    def setOnMessageReceivedCallback(self, callback: Any) -> None:
        self.on_message = callback

    def setOnNodeConnectedCallback(self, callback: Any) -> None:
        self.on_connected = callback

    def setOnNodeDisconnectedCallback(self, callback: Any) -> None:
        pass

    def setOnReadonlyNodeConnectedCallback(self, callback: Any) -> None:
        pass

    def setOnReadonlyNodeDisconnectedCallback(self, callback: Any) -> None:
        pass

    def setOnUtilityMessageCallback(self, message: str, callback: Any) -> None:
        pass

    def tryGetReady(self) -> None:
        pass

    def waitReady(self) -> None:
        pass

    def addNode(self, node: object) -> None:
        pass

    def dropNode(self, node: object) -> None:
        pass

    def destroy(self) -> None:
        pass

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        self.post(self.address, str(node.id), pickle.loads(pickle.dumps(message)))
        return True
