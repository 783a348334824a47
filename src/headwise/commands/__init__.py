"""One module per ``headwise`` subcommand (discovered by :mod:`headwise.cli`)."""
