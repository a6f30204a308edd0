"""Test clients and backends for the streaming server (independent of the server's framing code)."""
