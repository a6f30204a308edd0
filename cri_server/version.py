"""husk-cri's version, reported by the Version RPC and `husk-cri --version`."""

VERSION = "0.1.0"
