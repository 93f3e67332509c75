"""000 §4.5 consumer groups: the clauses this file will cover (being built by another engineer;
no tests here yet, and none skipped).

- §4.5: "The event log node MUST NOT assign a consumer group on its own. Consumer group
  membership claims MUST be made by the consumer. Links that are bound to consumer groups MUST
  also be bound to a partition; they cannot be partition-agnostic."
- §4.5: "If consumer groups are being used, the event log node MUST allow at most one active
  'receive' link for each combination of partition and consumer group."
- §4.5.1: node-assigned partition ownership — a group link without a partition MAY be bound
  by the node (§4.3); surplus consumers MAY be refused with `detach-forced` or kept pending;
  "If the event log node wants to force renegotiation of partition bindings amongst a consumer
  group, it SHOULD gracefully close all partition-bound links and the respective consumers
  SHOULD attempt to establish a new link"; agnostic group links SHOULD get
  `event-streams-associated-partitions-changed` on the next transfer.
- §4.5.2: consumer-negotiated ownership — "Any subsequent attempt to attach a link to the same
  combination of partition and consumer group of an already active link MUST be rejected
  UNLESS the newly attaching receiver provides an epoch counter greater than the current epoch
  counter value"; a greater epoch closes the existing link, attaches the new one and records
  the epoch; the epoch MAY be reset to zero when no link remains.
- §4.6.2 `event-streams-consumer-group` link property (string): "A negotiated link carrying this
  property MUST be partition-bound."; the node MAY require a configured group.
- §4.6.3 `event-streams-epoch` link property (long): the ownership epoch, returned on a
  successful attach; MAY be reset to zero when no link is attached.
- §4.6.5 `event-streams-associated-partitions-changed` delivery annotation: "For all
  partition-agnostic consumer links, the event log node SHOULD add this annotation to the next
  transfer to the consumer every time the association of partitions with the link changes."
  (the consumer MUST strip it when forwarding).

Spate's design for these: docs/adr/0015-consumer-groups.md.
"""
