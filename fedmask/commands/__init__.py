"""Subcommands of the `fedmask` console script, one module per area."""
