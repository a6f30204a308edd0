"""The `husk-cri` command: a click group that sub-systems mount their commands on (`husk-cri images ...`).

Placeholder group owned by the CRI engineer; the daemon command is theirs. Imports stay lazy.
"""
from __future__ import annotations

import click

from cri_server.images.cli import images


@click.group("husk-cri")
def main() -> None:
    """husk's CRI v1 server and its operator commands."""


main.add_command(images)

if __name__ == "__main__":
    main()
