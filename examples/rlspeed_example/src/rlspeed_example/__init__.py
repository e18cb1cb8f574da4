"""rlspeed-example: a task (``hallway``) and an algorithm (``xsarsa``) for rlspeed, added
through the entry points in this package's pyproject.toml."""
