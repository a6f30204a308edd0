"""husk-shim: one per container; holds stdio, logs and the exit status, reaps. May import runtime/, never cri_server/."""
