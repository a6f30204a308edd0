"""Generated message classes (scripts/gen-shim-proto); import the module you need."""
