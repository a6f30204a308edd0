"""husk-cri's metadata: sandbox and container records in one SQLite file, an in-memory index, locks."""
