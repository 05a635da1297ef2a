"""The storage directory lock (dbsp.storage.lock): one live process per directory."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from dbsp.storage.lock import DirectoryLock, DirectoryLocked

HOLD = """
import sys, time
from dbsp.storage.lock import DirectoryLock
lk = DirectoryLock(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""

TRY = """
import sys, time
from dbsp.storage.lock import DirectoryLock, DirectoryLocked
t = float(sys.argv[2])
while time.time() < t:
    pass
try:
    lk = DirectoryLock(sys.argv[1])
except DirectoryLocked as e:
    print("refused", e.pid, flush=True)
    sys.exit(0)
print("won", flush=True)
time.sleep(120)  # hold the lock until the test has heard from every opener (then killed)
"""


def _holder(d, seconds=60):
    p = subprocess.Popen([sys.executable, "-c", HOLD, d, str(seconds)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_second_opener_gets_an_error_naming_pid_and_host(tmp_path):
    p = _holder(str(tmp_path))
    try:
        with pytest.raises(DirectoryLocked) as e:
            DirectoryLock(str(tmp_path))
        assert e.value.pid == p.pid
        assert str(p.pid) in str(e.value) and socket.gethostname() in str(e.value)
    finally:
        p.kill()
        p.wait()


def test_lock_of_a_killed_process_is_taken_over(tmp_path):
    p = _holder(str(tmp_path))
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with DirectoryLock(str(tmp_path)) as lk:
        assert lk.held
        assert open(os.path.join(str(tmp_path), "LOCK")).read().split()[0] == str(os.getpid())


def test_same_process_twice_is_refused_then_released(tmp_path):
    a = DirectoryLock(str(tmp_path))
    with pytest.raises(DirectoryLocked):
        DirectoryLock(str(tmp_path))
    a.release()
    DirectoryLock(str(tmp_path)).release()


@pytest.mark.slow
def test_twenty_openers_at_once_exactly_one_wins(tmp_path):
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", TRY, str(tmp_path), str(start)],
                              stdout=subprocess.PIPE, text=True) for _ in range(20)]
    try:
        outs = [p.stdout.readline().split() for p in procs]  # every opener's verdict
    finally:
        for p in procs:
            p.kill()
            p.wait()
    won = [o for o in outs if o and o[0] == "won"]
    refused = [o for o in outs if o and o[0] == "refused"]
    assert len(won) == 1 and len(refused) == 19, outs


def test_circuit_holds_the_lock_until_closed(tmp_path):
    import pyarrow as pa

    from dbsp.runtime.circuit import Circuit
    c = Circuit(storage=str(tmp_path))
    c.add_input("t", pa.schema([("x", pa.int64())])).output()
    with pytest.raises(DirectoryLocked, match="locked by process"):
        Circuit(storage=str(tmp_path))
    c.close()
    Circuit(storage=str(tmp_path)).close()
