"""The ``crown`` subcommands (one module each where they are long); ``crown_cli.cli`` is the
entry point that gathers them."""
