"""``python -m crown_cli`` runs the ``crown`` command."""
from crown_cli.cli import main

main()
