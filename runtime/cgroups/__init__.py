"""Cgroup managers: `manager.py` holds the interface and the shared stats record; `v1.py` and `v2.py` implement it."""
