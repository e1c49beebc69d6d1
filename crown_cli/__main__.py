"""``python -m crown_cli`` runs the ``crown`` command."""
from .cli import main

main()
