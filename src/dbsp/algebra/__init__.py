"""The algebra layer, the bottom of the stack: what every layer above shares.

* :mod:`~dbsp.algebra.codes`: normalized, order-preserving key codes (``KeyCodec``, ``Codes``);
* :mod:`~dbsp.algebra.kernels`: the native kernels (sort, merge, seek, join, hash), specified by
  :mod:`~dbsp.algebra.kernels_ref`;
* :mod:`~dbsp.algebra.schema`: schemas, input validation and conversion of user data;
* :mod:`~dbsp.algebra.dtypes`: the type system (kinds of types, widening to a common type);
* :mod:`~dbsp.algebra.time`: time types as integers and durations in their units.
"""
