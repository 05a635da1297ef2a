"""The circuit layer: graphs of operators and how one worker steps them.

* :mod:`~dbsp.circuit.graph`: ``Node`` and ``Graph``, the logical circuit built by stream verbs;
* :mod:`~dbsp.circuit.scheduler`: ``Scheduler``, one worker's operator instances and the step
  order (strict operators first, then the rest in construction order, then their inputs);
* :mod:`~dbsp.circuit.operator`: the ``Operator`` interface and the ``WorkerContext``;
* :mod:`~dbsp.circuit.exchange`: the sharding function, dealing rows to workers, and the
  ``Transport`` interface that the runtime implements;
* :mod:`~dbsp.circuit.types`: the stream types (``ZSetType``, ``IndexedType``).

It knows no operator (those are in :mod:`dbsp.operators`, above) and no thread or process (the
runtime, above that): arrows go down only.
"""
