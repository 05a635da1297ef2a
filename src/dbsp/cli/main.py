"""The ``dbsp`` command: run the Nexmark benchmark, inspect storage files, report the build.

Subcommands (each imports only what it needs):

* ``dbsp nexmark --events N --queries q0,q1,... --workers 1,2 [--verify] [--json FILE]``
* ``dbsp storage inspect PATH`` / ``dbsp storage verify PATH``
* ``dbsp info`` – version, native kernels, storage backends available here
* ``dbsp worker --coordinator HOST:PORT --worker I [--listen HOST] [--advertise HOST]`` – one
  worker of a launched job (:mod:`dbsp.runtime.launcher`); its credentials come from the
  environment variable ``DBSP_MESH_AUTH``
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


def _worker(args) -> int:
    import logging
    import os

    from dbsp.runtime.launcher import AUTH_ENV, serve_worker
    from dbsp.runtime.socket_transport import MeshAuth
    text = os.environ.get(AUTH_ENV)
    if not text:
        print(f"dbsp worker: the job's credentials are missing: set {AUTH_ENV} (the launcher's "
              f"Job.worker_command(i) shows the whole command)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="dbsp worker %(levelname)s %(message)s")
    serve_worker(args.coordinator, MeshAuth.from_text(text), args.worker,
                 listen_host=args.listen, advertise_host=args.advertise, timeout=args.timeout)
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

    wk = sub.add_parser("worker", help="run one worker of a launched job (dbsp.runtime.launcher)")
    wk.add_argument("--coordinator", required=True, help="HOST:PORT of the job's coordinator")
    wk.add_argument("--worker", required=True, type=int, help="this worker's index, 0..W-1")
    wk.add_argument("--listen", default="127.0.0.1",
                    help="address to accept the other workers on (default 127.0.0.1)")
    wk.add_argument("--advertise", default=None,
                    help="host the other workers dial (default: the --listen address)")
    wk.add_argument("--timeout", type=float, default=120.0,
                    help="seconds to wait for the coordinator and the mesh")

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
    if args.cmd == "worker":
        return _worker(args)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
