"""The node process: wires the metadata service (spate.cluster), the partitions (spate.node), the
AMQP listener (spate.gateway) and the gRPC admin API into one asyncio program. The only package
allowed to import all three."""
