"""The trace layer: batches, cursors, spines and the policy that keeps state within memory.

* :mod:`~dbsp.trace.batch`: ``ZSet`` (loose), ``OrdZSet``, ``OrdIndexedZSet``;
  :mod:`~dbsp.trace.timed`: ``OrdKeyBatch`` / ``OrdValBatch`` (times per value);
  :mod:`~dbsp.trace.file_batch`: the same batches in layer files;
* :mod:`~dbsp.trace.cursor` and :mod:`~dbsp.trace.spine_cursor`: walking batches and spines;
* :mod:`~dbsp.trace.spine`: the LSM of batches behind every piece of operator state;
* :mod:`~dbsp.trace.merge_stream`: bounded-memory merges into memory or a file;
* :mod:`~dbsp.trace.spill`: the memory accountant and the spilling policy
  (``SpineStorage``); :mod:`~dbsp.trace.merge_helper`: large merges in a helper process.
"""
