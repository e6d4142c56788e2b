"""fedmask: the command-line entry point that composes the packages."""
