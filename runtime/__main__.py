"""`python -m runtime ARGS`: the husk CLI (the same as `python -m runtime.cli`; the installed `husk` launcher is
faster: runtime/launcher.py)."""
import sys

from runtime.cli import main

sys.exit(main())
