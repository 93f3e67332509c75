"""Spate: a partitioned, Raft-replicated event-stream broker speaking AMQP 1.0."""
