// A rhea (Node.js AMQP 1.0) client driven by the Python tests.
// Usage: node client.js < args.json  -> prints one JSON object with what happened, then exits.
// Input: {port, host?, tls?: {ca}, username?, password?, steps: [...]}; steps run in order:
//   {op: "publish", address, bodies: [str] | {prefix, count}, properties?, first_publishing_id?}
//       group_keys?: [str|null] (message k's event-streams-group-key annotation), message_ids?: [str|null],
//       filter_values?: [str|null] (x-stream-filter-value), application_properties?: [{k: v}|null]
//       -> outcomes: ["accepted"|condition] (outcomes[k] is message k's, whatever order the
//       broker settled them in), attach_properties (the broker's attach properties);
//       with first_publishing_id, message k carries x-opt-publishing-id (ulong) = first + k;
//       window: at most this many unconfirmed; hold_after: send only the first n and never end
//       (the test kills the process); progress_every: a line {progress: {sent, outcomes,
//       accepted}} every n outcomes and when holding (the report stays the last line);
//       sub_entries: [hex] instead of bodies: message k is a sub-entry (ADR 0017), its body
//       one data section holding those bytes, annotated x-opt-spate-sub-entry = true
//   {op: "consume", address, count, filter?, properties?, exact?} -> messages: [{body, offset, timestamp, source_partition, active, stream}],
//       attach_properties; the step ends when the broker answered the detach; `exact`: credit
//       for `count` deliveries only (a named consumer then stores exactly what it took)
//   {op: "attach", address, role: "sender"|"receiver", filter?, properties?} -> error or attach info
// properties: {key: value}, booleans as AMQP booleans, {type, value} typed as in filters,
//   everything else as symbols
// filter: {key: {descriptor?: number|string, type: "long"|"string"|"symbol"|"timestamp"|"map"|
//   "boolean"|"list" (of strings), value}}
"use strict";
const rhea = require("rhea");
const types = rhea.types;

const args = JSON.parse(require("fs").readFileSync(0, "utf8"));
const result = { steps: [] };
let finished = false;
const deadline = setTimeout(() => finish("timeout"), args.timeout_ms || 20000);

// the broker's attach properties, values as strings (ulong/long wrappers unwrapped)
function attachProperties(link) {
  const props = link.remote.attach.properties || {};
  const out = {};
  for (const [k, v] of Object.entries(props)) out[k] = typeof v === "object" && v !== null && v.value !== undefined ? String(v.value) : String(v);
  return out;
}

function finish(error) {
  clearTimeout(deadline);
  if (error) result.error = error;
  if (finished) return;
  finished = true;
  process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(0));
}

function wrapValue(spec) {
  switch (spec.type) {
    case "long": return types.wrap_long(spec.value);
    case "ulong": return types.wrap_ulong(spec.value);
    case "string": return types.wrap_string(spec.value);
    case "symbol": return types.wrap_symbol(spec.value);
    case "timestamp": return types.wrap_timestamp(spec.value);
    case "boolean": return types.wrap_boolean(spec.value);
    case "list": return types.wrap_list(spec.value.map((v) => types.wrap_string(v)));
    case "map": {
      const m = {};
      for (const [k, v] of Object.entries(spec.value)) m[k] = wrapValue(v);
      return types.wrap_symbolic_map(m);
    }
    default: throw new Error("unknown filter type " + spec.type);
  }
}

function buildFilter(filter) {
  if (!filter) return undefined;
  const out = {};
  for (const [key, spec] of Object.entries(filter)) {
    out[key] = spec.descriptor === undefined ? wrapValue(spec)
      : types.wrap_described(wrapValue(spec), spec.descriptor);
  }
  return out;
}

function linkProps(props) {
  if (!props) return undefined;
  const out = {};
  for (const [k, v] of Object.entries(props)) {
    out[k] = typeof v === "boolean" ? types.wrap_boolean(v)
      : typeof v === "object" && v !== null && v.type ? wrapValue(v) : types.wrap_symbol(String(v));
  }
  return out;
}

function errorOf(e) {
  if (!e) return null;
  const info = {};
  if (e.info) for (const [k, v] of Object.entries(e.info)) info[k] = typeof v === "object" && v !== null && v.value !== undefined ? v.value : v;
  return { condition: e.condition, description: e.description, info };
}

const options = { host: args.host || "127.0.0.1", port: args.port, reconnect: false };
if (args.tls) {
  options.transport = "tls";
  options.ca = [args.tls.ca];
  options.servername = "localhost";
  options.rejectUnauthorized = true;
}
if (args.username !== undefined) {
  options.username = args.username;
  options.password = args.password;
}

const container = rhea.create_container({ id: "rhea-test" });
const connection = container.connect(options);
let linkCounter = 0;

connection.on("connection_open", (ctx) => {
  result.offered_capabilities = ctx.connection.remote.open.offered_capabilities || [];
  runStep(0);
});
connection.on("connection_error", (ctx) => { result.connection_error = errorOf(ctx.connection.error); });
connection.on("disconnected", (ctx) => {
  result.disconnected = String(ctx.error || "disconnected");
  finish();
});
connection.on("error", (e) => { result.connection_error = { condition: String(e) }; finish(); });

function runStep(i) {
  if (i >= args.steps.length) { connection.close(); finish(); return; }
  const step = args.steps[i];
  const out = { op: step.op };
  result.steps.push(out);
  const next = () => runStep(i + 1);
  const name = "link-" + (++linkCounter);
  if (step.op === "publish") {
    if (step.sub_entries) step.bodies = step.sub_entries;
    if (!Array.isArray(step.bodies)) {
      const { prefix, count } = step.bodies;
      step.bodies = Array.from({ length: count }, (_, k) => prefix + k);
    }
    const sender = connection.open_sender({ name, target: { address: step.address }, properties: linkProps(step.properties) });
    out.outcomes = [];
    let sent = 0;
    let settled = 0; // out.outcomes fills by message index, not in settlement order
    const done = () => { if (settled === step.bodies.length) { sender.close(); next(); } };
    sender.on("sender_open", (ctx) => {
      out.attach_properties = attachProperties(ctx.sender);
    });
    const limit = step.hold_after === undefined ? step.bodies.length : step.hold_after;
    let accepted = 0;
    const progress = (force) => {
      if (force || (step.progress_every && settled % step.progress_every === 0)) {
        process.stdout.write(JSON.stringify({ progress: { sent, outcomes: settled, accepted } }) + "\n");
      }
    };
    const pump = () => {
      while (sender.sendable() && sent < limit && !(sent - settled >= step.window)) {
        const message = step.sub_entries
          ? { body: rhea.message.data_section(Buffer.from(step.sub_entries[sent], "hex")),
              message_annotations: { "x-opt-spate-sub-entry": true } }
          : { body: step.bodies[sent] };
        if (step.first_publishing_id !== undefined) {
          message.message_annotations = Object.assign(message.message_annotations || {},
            { "x-opt-publishing-id": types.wrap_ulong(step.first_publishing_id + sent) });
        }
        if (step.group_keys && step.group_keys[sent] !== null && step.group_keys[sent] !== undefined) {
          message.message_annotations = Object.assign(message.message_annotations || {},
            { "event-streams-group-key": step.group_keys[sent] });
        }
        if (step.message_ids && step.message_ids[sent] !== null && step.message_ids[sent] !== undefined) {
          message.message_id = step.message_ids[sent];
        }
        if (step.filter_values && step.filter_values[sent] !== null && step.filter_values[sent] !== undefined) {
          message.message_annotations = Object.assign(message.message_annotations || {},
            { "x-stream-filter-value": step.filter_values[sent] });
        }
        if (step.application_properties && step.application_properties[sent]) {
          message.application_properties = step.application_properties[sent];
        }
        sender.send(message).spate_index = sent;
        sent++;
        if (sent === step.hold_after) progress(true); // holding: the step never ends
      }
    };
    const outcome = (delivery, value) => {
      out.outcomes[delivery.spate_index] = value;
      settled++;
      progress(false); pump(); done();
    };
    sender.on("sendable", pump);
    sender.on("accepted", (ctx) => { accepted++; outcome(ctx.delivery, "accepted"); });
    sender.on("rejected", (ctx) => { outcome(ctx.delivery, errorOf(ctx.delivery.remote_state.error)); });
    sender.on("sender_error", (ctx) => { out.error = errorOf(ctx.sender.error); next(); });
  } else if (step.op === "consume") {
    const receiver = connection.open_receiver({
      name, source: { address: step.address, filter: buildFilter(step.filter) },
      properties: linkProps(step.properties), credit_window: step.exact ? 0 : 100, autoaccept: true,
    });
    if (step.exact) receiver.add_credit(step.count); // exactly count deliveries, no more
    out.messages = [];
    receiver.on("receiver_open", (ctx) => {
      const f = ctx.receiver.remote.attach.source && ctx.receiver.remote.attach.source.filter;
      out.echoed_filter_keys = f ? Object.keys(f) : [];
      out.attach_properties = attachProperties(ctx.receiver);
    });
    receiver.on("message", (ctx) => {
      if (out.messages.length >= step.count) return; // in flight before the close
      const da = ctx.message.delivery_annotations || {};
      const ts = da["event-streams-timestamp"];
      out.messages.push({
        body: ctx.message.body,
        offset: da["event-streams-offset"],
        timestamp: ts instanceof Date ? ts.getTime() : ts,
        source_partition: da["event-streams-source-partition"],
        active: da["spate:active"],
        stream: da["spate:stream"],
      });
      if (out.messages.length === step.count) {
        receiver.once("receiver_close", () => next()); // the broker answers once it stored
        receiver.close();
      }
    });
    receiver.on("receiver_error", (ctx) => { out.error = errorOf(ctx.receiver.error); next(); });
  } else if (step.op === "attach") {
    const link = step.role === "sender"
      ? connection.open_sender({ name, target: { address: step.address }, properties: linkProps(step.properties) })
      : connection.open_receiver({ name, source: { address: step.address, filter: buildFilter(step.filter) }, properties: linkProps(step.properties) });
    const kind = step.role === "sender" ? "sender" : "receiver";
    link.on(kind + "_error", (ctx) => { out.error = errorOf(ctx[kind].error); next(); });
    link.on(kind + "_open", () => { setTimeout(() => { if (!out.error) { out.opened = true; link.close(); next(); } }, 200); });
  } else {
    throw new Error("unknown op " + step.op);
  }
}
