"""Thin wrappers over Linux interfaces (libc via ctypes, /proc). No policy lives here."""
