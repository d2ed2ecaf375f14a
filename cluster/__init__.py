"""Many Roost brokers: cluster config, peer links, replication, membership, launcher."""
