// rhea as an idempotent Event Hubs sender that resumes a producer group (what the SDKs do after
// a failure: attach with the group's id and send from a sequence number), for the Event Hubs
// dialect's idempotent publishing test (tests/eventhubs/test_js_sdk.py).
// Usage: node raw_idempotent.js < {port, address, producer_id, first_sequence, bodies: [str]}
//   -> {attach: {producer_id, producer_epoch, last_sequence_number}, outcomes: [str]}
"use strict";
const rhea = require("rhea");
const args = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = { outcomes: [] };
function finish() {
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
}
setTimeout(finish, 10000);
const container = rhea.create_container();
const connection = container.connect({ host: "127.0.0.1", port: args.port, reconnect: false });
const sender = connection.open_sender({
  target: { address: args.address },
  desired_capabilities: ["com.microsoft:idempotent-producer"],
  properties: {
    "com.microsoft:producer-id": rhea.types.wrap_long(args.producer_id),
    "com.microsoft:producer-epoch": rhea.types.wrap_short(0),
    "com.microsoft:producer-sequence-number": rhea.types.wrap_int(args.first_sequence - 1),
  },
});
sender.once("sendable", () => {
  const p = sender.properties || {};
  out.attach = {
    producer_id: String(p["com.microsoft:producer-id"]),
    producer_epoch: p["com.microsoft:producer-epoch"],
    last_sequence_number: p["com.microsoft:producer-sequence-number"],
  };
  args.bodies.forEach((body, i) => {
    sender.send({
      body,
      message_annotations: {
        "com.microsoft:producer-id": rhea.types.wrap_long(args.producer_id),
        "com.microsoft:producer-epoch": rhea.types.wrap_short(0),
        "com.microsoft:producer-sequence-number": rhea.types.wrap_int(args.first_sequence + i),
      },
    });
  });
});
function settled(kind) {
  return (context) => {
    const error = context.delivery.remote_state && context.delivery.remote_state.error;
    out.outcomes.push(error ? `${kind}: ${error.condition}` : kind);
    if (out.outcomes.length === args.bodies.length) finish();
  };
}
sender.on("accepted", settled("accepted"));
sender.on("rejected", settled("rejected"));
sender.on("sender_error", (context) => {
  const error = context.sender.error;
  out.link_error = error && String(error.condition);
  finish();
});
