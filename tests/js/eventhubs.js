// @azure/event-hubs (npm) driven by the Python tests (tests/eventhubs): the SDK's README
// patterns, with only the connection string changed.
// Usage: node eventhubs.js < args.json -> prints one JSON object, then exits.
// Input: {connection_string, hub, ca?: PEM path (TLS: trusted like a custom CA), steps: [...]}
//   {op: "send", bodies: [str], partition_id?, partition_key?, max_retries?} -> {sent}
//   any step with expect_error: true -> {error: "<code>: <message>"} instead of failing the run
//   {op: "properties"} -> {hub: {name, partition_ids}, partitions: {id: {...}}}
//   {op: "receive", count, partition_id?, from?: "earliest" | {offset} | {sequence_number}
//       | {enqueued_on_ms}, owner_level?} -> events: [{partition, body, sequence_number,
//       offset, enqueued_ms, partition_key, properties}], errors: [str]
//   {op: "send_idempotent", bodies: [str], partition_id} -> {sent, producer_group_id,
//       last_sequence_number} (EventHubBufferedProducerClient, enableIdempotentRetries)
//   {op: "key_partitions", keys: [str], partition_count} -> {key: partition index} by the SDK's
//       own partition-key mapper (what the Event Hubs service computes)
"use strict";
const fs = require("fs");
const path = require("path");
const {
  EventHubProducerClient, EventHubBufferedProducerClient, EventHubConsumerClient, earliestEventPosition,
} = require("@azure/event-hubs");

const args = JSON.parse(fs.readFileSync(0, "utf8"));
const options = {};
if (args.ca) {
  // Node's TLS takes a custom CA through the connection's socket options
  options.customEndpointAddress = args.custom_endpoint;
  options.webSocketOptions = undefined;
  process.env.NODE_EXTRA_CA_CERTS = args.ca;
}

function position(from) {
  if (!from || from === "earliest") return earliestEventPosition;
  if (from.offset !== undefined) return { offset: from.offset, isInclusive: !!from.inclusive };
  if (from.sequence_number !== undefined) return { sequenceNumber: from.sequence_number, isInclusive: !!from.inclusive };
  return { enqueuedOn: new Date(from.enqueued_on_ms) };
}

async function step(s) {
  if (s.op === "send") {
    const producerOptions = s.max_retries === undefined
      ? options
      : { ...options, retryOptions: { maxRetries: s.max_retries } };
    const producer = new EventHubProducerClient(args.connection_string, args.hub, producerOptions);
    const batchOptions = {};
    if (s.partition_id !== undefined) batchOptions.partitionId = s.partition_id;
    if (s.partition_key !== undefined) batchOptions.partitionKey = s.partition_key;
    const batch = await producer.createBatch(batchOptions);
    for (const body of s.bodies) {
      if (!batch.tryAdd({ body, properties: { from: "js" } })) throw new Error("batch full");
    }
    await producer.sendBatch(batch);
    await producer.close();
    return { sent: s.bodies.length };
  }
  if (s.op === "send_idempotent") {
    // the buffered producer's documented idempotent publishing (enableIdempotentRetries)
    const errors = [];
    const client = new EventHubBufferedProducerClient(args.connection_string, args.hub, {
      ...options,
      enableIdempotentRetries: true,
      onSendEventsErrorHandler: (ctx) => errors.push(String(ctx.error && (ctx.error.code || ctx.error.message))),
    });
    await client.enqueueEvents(s.bodies.map((body) => ({ body })), { partitionId: s.partition_id });
    await client.flush();
    const props = await client._producer.getPartitionPublishingProperties(s.partition_id);
    await client.close({ flush: true });
    if (errors.length) throw new Error(`send failed: ${errors.join("; ")}`);
    return {
      sent: s.bodies.length,
      producer_group_id: String(props.producerGroupId),
      last_sequence_number: props.lastPublishedSequenceNumber,
    };
  }
  if (s.op === "properties") {
    const client = new EventHubConsumerClient("$Default", args.connection_string, args.hub, options);
    const hub = await client.getEventHubProperties();
    const partitions = {};
    for (const id of hub.partitionIds) {
      const p = await client.getPartitionProperties(id);
      partitions[id] = {
        beginning: p.beginningSequenceNumber,
        last_sequence_number: p.lastEnqueuedSequenceNumber,
        last_offset: String(p.lastEnqueuedOffset),
        empty: p.isEmpty,
      };
    }
    await client.close();
    return { hub: { name: hub.name, partition_ids: hub.partitionIds }, partitions };
  }
  if (s.op === "receive") {
    const client = new EventHubConsumerClient("$Default", args.connection_string, args.hub, options);
    const events = [];
    const errors = [];
    await new Promise((resolve) => {
      const handlers = {
        processEvents: async (received, context) => {
          for (const e of received) {
            events.push({
              partition: context.partitionId,
              body: e.body,
              sequence_number: e.sequenceNumber,
              offset: String(e.offset),
              enqueued_ms: e.enqueuedTimeUtc.getTime(),
              partition_key: e.partitionKey === undefined ? null : e.partitionKey,
              properties: e.properties || {},
            });
          }
          if (events.length >= s.count) resolve();
        },
        processError: async (err) => {
          errors.push(String(err && (err.code || err.message) || err));
        },
      };
      const subscribeOptions = { startPosition: position(s.from), maxBatchSize: 100, maxWaitTimeInSeconds: 1 };
      if (s.owner_level !== undefined) subscribeOptions.ownerLevel = s.owner_level;
      const subscription = s.partition_id !== undefined
        ? client.subscribe(s.partition_id, handlers, subscribeOptions)
        : client.subscribe(handlers, subscribeOptions);
      setTimeout(resolve, s.timeout_ms || 20000);
      client._subscription = subscription;
    });
    await client.close();
    return { events, errors };
  }
  if (s.op === "key_partitions") {
    // the SDK's own port of the service's partition-key hash (its buffered producer's mapper)
    const sdk = path.dirname(require.resolve("@azure/event-hubs"));
    const { mapPartitionKeyToId } = require(path.join(sdk, "impl", "partitionKeyToIdMapper.js"));
    const out = {};
    for (const key of s.keys) out[key] = mapPartitionKeyToId(key, s.partition_count);
    return out;
  }
  throw new Error(`unknown op ${s.op}`);
}

(async () => {
  const out = { steps: [] };
  try {
    for (const s of args.steps) {
      if (!s.expect_error) {
        out.steps.push(await step(s));
        continue;
      }
      try {
        out.steps.push(await step(s));
      } catch (err) {
        out.steps.push({ error: `${err && (err.code || err.name)}: ${err && err.message}` });
      }
    }
  } catch (err) {
    out.error = String(err && err.stack || err);
  }
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
})();
