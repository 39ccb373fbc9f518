"""Parallel styles applied before fully_shard: TP/SP (DTensor and local-tensor), CP attention, EP/ETP."""
