"""The runtime layer: the communicator, the entry cache, the path choice and the paths.

Used by ``distgemm.ops`` (and by ``compat/`` and ``tune`` for a few of its names); each module
imports only the ones below it (docs/architecture.md, tests/test_layers.py).
"""
