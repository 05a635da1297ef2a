"""One module per operator, each with its maths, its incremental form and a runnable example.

:mod:`~dbsp.operators.stream` holds the stream verbs (``Stream`` / ``IndexedStream``) that add
these operators to a circuit graph; :mod:`~dbsp.operators.exchange` is the re-sharding operator
the key-based operators put in front of themselves.
"""
