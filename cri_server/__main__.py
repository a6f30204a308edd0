"""`python -m cri_server` runs husk-cri (the same as the husk-cri console script)."""
from cri_server.cli import main

main()
