"""The admin API's wire contract: `v1` (generated from proto/spate/api/v1/admin.proto by
`make proto`) and `tls` (TLS and mutual TLS credentials for serving and calling it, ADR 0023
addendum), shared by nodes, gateways, the CLI and spate perf."""
