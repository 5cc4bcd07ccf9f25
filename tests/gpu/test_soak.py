"""A short decode soak (tests/gpu/soak.py): 4 threads on 2 streams, changing shapes; outputs equal
the single-threaded run bit for bit, no device-memory or plan-cache growth. AOTC_SOAK_CALLS sets
the count (default 20000; the full 10^6 is `python tests/gpu/soak.py`)."""
import os

from . import soak


def test_threads_on_shared_streams_match_the_single_threaded_run_without_growth():
    report = soak.soak(calls=int(os.environ.get("AOTC_SOAK_CALLS", "20000")), threads=4, streams=2,
                       check_every=2000)
    print(report)
    assert report["problems"] == [], report
    assert report["after"]["plans"] <= report["max_plans"]
