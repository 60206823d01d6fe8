"""Workload drift: what changed in the traffic, how much, and whether it matters."""
