"""The decision level: held-out and teacher decision sets, each policy's answers to them, and their tables and
state values (the ``recruit-trl benchmark`` command and the run report's decision section)."""
