"""SPDY/3.1 as Kubernetes streaming uses it: frames.py (wire format), session.py (server session)."""
