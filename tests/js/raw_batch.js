// rhea sending one transfer in the Event Hubs batch format (0x80013700) to an address, for the
// refusal tests of the Event Hubs dialect (tests/eventhubs/test_tokens.py).
// Usage: node raw_batch.js < {port, address, batch: true|false (false: an amqp-value body)}
//   -> {outcome: "accepted"|"rejected"|..., condition?, link_error?}
"use strict";
const rhea = require("rhea");
const args = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = {};
function finish() {
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
}
setTimeout(finish, 10000);
const container = rhea.create_container();
const connection = container.connect({ host: "127.0.0.1", port: args.port, reconnect: false });
const sender = connection.open_sender(args.address);
sender.once("sendable", () => {
  const inner = rhea.message.encode({ body: "inner" });
  const payload = args.batch
    ? rhea.message.encode({ body: rhea.message.data_sections([inner, inner]) })
    : rhea.message.encode({ body: "not a batch" });
  sender.send(payload, undefined, 0x80013700);
});
sender.on("accepted", () => { out.outcome = "accepted"; finish(); });
sender.on("rejected", (context) => {
  out.outcome = "rejected";
  const error = context.delivery.remote_state && context.delivery.remote_state.error;
  out.condition = error && String(error.condition);
  finish();
});
sender.on("sender_error", (context) => {
  const error = context.sender.error;
  out.link_error = error && String(error.condition);
  finish();
});
