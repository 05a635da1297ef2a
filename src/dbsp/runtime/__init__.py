"""The runtime: a circuit running on W worker replicas in lockstep.

* :mod:`~dbsp.runtime.circuit`: ``Circuit``, the runnable circuit (inputs, outputs, workers,
  storage; ``step`` and ``close``);
* :mod:`~dbsp.runtime.threads`: workers as threads of this process, ``InProcTransport``;
* :mod:`~dbsp.runtime.process`: worker 0 here, the others forked, over a socket mesh;
* :mod:`~dbsp.runtime.socket_transport`: the socket mesh transport (also between hosts);
* :mod:`~dbsp.runtime.placement`: dealing input rows by the key of the first exchange they meet;
* :mod:`~dbsp.runtime.slices`: inputs the workers read themselves, each its own pieces of a
  sliced source (no row through the driver);
* :mod:`~dbsp.runtime.launcher`: W worker processes on this machine or on hosts given by address.
"""
