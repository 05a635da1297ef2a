"""The ``dbsp`` command: run the Nexmark benchmark, inspect storage files, report the build.

Subcommands (each imports only what it needs):

* ``dbsp nexmark --events N --queries q0,q1,... --workers 1,2 [--verify] [--json FILE]``
* ``dbsp storage inspect PATH`` / ``dbsp storage verify PATH``
* ``dbsp info`` – version, native kernels, storage backends available here
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _info(_args) -> int:
    import dbsp
    from dbsp.algebra import kernels
    native = kernels.using_native()
    print(f"dbsp {dbsp.__version__}")
    missing = [k for k, v in native.items() if not v]
    print("native kernels: " + ("all" if not missing else f"missing {missing}"))
    try:
        from dbsp.storage import backend
        avail = backend.available_backends()
        ok = [k for k, why in avail.items() if why is None]
        print("storage backends: " + ", ".join(ok)
              + "".join(f"; {k} unavailable ({why})" for k, why in avail.items() if why))
        print(f"default backend: {backend.default_backend().name}")
    except Exception as e:  # storage is optional at this level
        print(f"storage backends: unavailable ({e})")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="dbsp", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    nx = sub.add_parser("nexmark", help="run the Nexmark benchmark on the embedded runtime")
    from dbsp.nexmark.cli import add_arguments  # light: no heavy imports at module level
    add_arguments(nx)

    st = sub.add_parser("storage", help="inspect or verify layer files")
    st_sub = st.add_subparsers(dest="storage_cmd", required=True)
    st_sub.add_parser("inspect", help="summary of a layer file").add_argument("path")
    st_sub.add_parser("verify", help="check every checksum and index bound").add_argument("path")

    sub.add_parser("info", help="version and build report")

    args = p.parse_args(argv)
    if args.cmd == "nexmark":
        from dbsp.nexmark.cli import run
        return run(args)
    if args.cmd == "storage":
        from dbsp.storage import inspect as ins
        if args.storage_cmd == "inspect":
            return ins.main_inspect([args.path])
        return ins.main_verify([args.path])
    if args.cmd == "info":
        return _info(args)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
