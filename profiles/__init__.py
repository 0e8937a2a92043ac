"""The shipped profiles as package data (``fastpp.profiles``).

See README.md here, and ``fastpp.profile_names`` for ``--profile NAME``."""
