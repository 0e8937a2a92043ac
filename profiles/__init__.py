"""The shipped profiles as package data (``fastpp.profiles``).

See README.md here, and ``fastpp.cli.profile_paths`` for ``--profile NAME``."""
