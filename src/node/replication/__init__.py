"""Partition replication: a sans-IO Raft core (etcd-raft style) driven by the node's shell."""
