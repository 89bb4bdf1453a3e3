"""An example lamport-lab op from a package of its own (README.md)."""
