"""OCI runtime specs for sandboxes and containers, built from CRI requests by small spec options."""
