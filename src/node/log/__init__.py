"""The durable partition log: chunks in segment files with sparse indexes (see README.md)."""

from spate.node.log.partition_log import LogConfig, LogInfo, PartitionLog, RecoveryReport, SyncPlan
from spate.node.log.storage import FileStorage, Storage

__all__ = [
    "FileStorage",
    "LogConfig",
    "LogInfo",
    "PartitionLog",
    "RecoveryReport",
    "Storage",
    "SyncPlan",
]
