"""The destination guard of a worker process, which reads the allow list
from its environment: a real listener on loopback counts every TCP
connection it accepts."""

from __future__ import annotations

from testsupport.destination_guard import add_listener_endpoints, outcomes_by_host
from testsupport.fixtures import wait_for, worker_process


async def test_a_worker_process_reads_the_allow_list_from_its_environment(db, dsn, listener):
    await add_listener_endpoints(db, listener, ["127.0.0.1"])
    worker = worker_process(dsn, HOOKLANE_ALLOWED_NETWORKS="10.20.0.0/16")
    try:
        outcomes = await wait_for(lambda: outcomes_by_host(db, 1), timeout=30)
    finally:
        worker.terminate()
        worker.wait(30)
    assert outcomes == {"127.0.0.1": ("pending", "destination 127.0.0.1 is not allowed")}
    assert listener.accepted == 0
