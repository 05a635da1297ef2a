"""The Spark sessions of the Spark tests, made in one place: a process holds one SparkContext at
a time, so one :class:`Sessions` for the whole run keeps at most one session alive, for the
master last asked for (``local[2]``, ``local-cluster[2,1,1024]``), and each test module that
asks for the same master reuses it: a start-up (10-30 s on this machine) is paid once per
change of master, not once per module."""
from __future__ import annotations

import os
import sys
import time

import pytest

from _spark import LOCAL, LOCAL4


class Sessions:
    """At most one live SparkSession, for the master last asked for."""

    def __init__(self):
        self.master, self.session = None, None

    def get(self, master: str):
        if self.master != master:
            self.stop()
            from pyspark.sql import SparkSession  # the test modules skip without pyspark
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
            os.environ["PYSPARK_PYTHON"] = sys.executable
            self.session = (SparkSession.builder.master(master).appName("dbsp-tests")
                            .config("spark.driver.host", "127.0.0.1")
                            .config("spark.driver.bindAddress", "127.0.0.1")
                            .config("spark.ui.enabled", "false")
                            .config("spark.sql.shuffle.partitions", "2")
                            .config("spark.executor.memory", "512m")
                            .config("spark.python.task.killTimeout", "500ms")
                            .getOrCreate())
            self.master = master
            if master.startswith("local-cluster"):
                wait_for_executors(self.session, 2)
        return self.session

    def stop(self):
        if self.session is not None:
            self.session.stop()
        self.master, self.session = None, None


def wait_for_executors(spark, n: int, timeout: float = 600.0) -> None:
    """Wait until ``n`` executors registered (on a loaded machine the standalone worker takes
    minutes to start their JVMs; a barrier job submitted before waits for slots meanwhile)."""
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout
    while sc._jsc.sc().getExecutorMemoryStatus().size() < n + 1:  # + the driver
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sc.master}: {n} executors did not register in "
                               f"{timeout:.0f} s")
        time.sleep(1.0)


@pytest.fixture(scope="session")
def sessions():
    """The run's :class:`Sessions` (``sessions.get(master)``)."""
    s = Sessions()
    yield s
    s.stop()


@pytest.fixture
def spark(sessions):
    """A ``local[2]`` session (2 task slots)."""
    return sessions.get(LOCAL)


@pytest.fixture
def spark4(sessions):
    """A ``local[4]`` session: 4 task slots, room for 3 barrier tasks and a Spark job."""
    return sessions.get(LOCAL4)
