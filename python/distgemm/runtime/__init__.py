"""The runtime layer: the communicator, the entry cache, the path choice and the paths.

Imported by ``distgemm.ops`` only; each module imports the ones below it (docs/architecture.md).
"""
