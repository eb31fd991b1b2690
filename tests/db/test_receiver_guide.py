"""docs/receivers.md's verification examples, run as written against real
deliveries: a worker signs, a receiver on loopback records the request, and
the Python and shell examples from the page must accept it, and refuse it
once tampered with."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import hooklane
from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.receivers import Answer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "receivers.md"


def _block(language: str, holding: str) -> str:
    """The one ``language`` block of the guide that holds ``holding``."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if holding in b]
    assert len(found) == 1, f"expected one {language} block with {holding!r} in {GUIDE.name}"
    return found[0]


async def _delivery(db, start_worker, receiver):
    await add_endpoint(db, "guide", receiver.on("guide", Answer(204)))
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.updated", data={"id": 7, "note": "é ✓"})
    await wait_for(lambda: receiver.at("guide"))
    return receiver.at("guide")[0]


async def test_the_python_example_verifies_a_real_delivery(db, start_worker, receiver):
    got = await _delivery(db, start_worker, receiver)
    example: dict = {}
    exec(compile(_block("python", "def verify("), str(GUIDE), "exec"), example)
    verify = example["verify"]
    headers = {k.lower(): v for k, v in got.headers.items()}
    assert verify(got.body, headers, SECRET)["data"] == {"id": 7, "note": "é ✓"}
    with pytest.raises(PermissionError):
        verify(got.body.replace(b"7", b"8"), headers, SECRET)
    with pytest.raises(PermissionError):
        verify(got.body, headers, "whsec_" + "A" * 32)


@pytest.mark.processes
async def test_the_shell_example_verifies_a_real_delivery(db, start_worker, receiver, tmp_path):
    # hack/setup installs openssl: its absence is a broken setup, not a reason to skip.
    assert shutil.which("openssl"), "openssl is not installed: run hack/setup"
    got = await _delivery(db, start_worker, receiver)
    script = tmp_path / "verify.sh"
    script.write_text(_block("sh", "openssl dgst"))

    def run(body: bytes, secret: str = SECRET, timestamp: str | None = None) -> subprocess.CompletedProcess:
        (tmp_path / "body.json").write_bytes(body)
        env = {
            **os.environ,
            "WEBHOOK_SECRET": secret,
            "WEBHOOK_ID": got.headers["webhook-id"],
            "WEBHOOK_TIMESTAMP": timestamp or got.headers["webhook-timestamp"],
            "WEBHOOK_SIGNATURE": got.headers["webhook-signature"],
        }
        return subprocess.run(
            ["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
        )

    accepted = run(got.body)
    assert (accepted.returncode, accepted.stdout) == (0, "verified\n"), accepted.stderr
    tampered = run(got.body.replace(b"7", b"8"))
    assert (tampered.returncode, tampered.stdout) == (1, "bad signature\n")
    assert run(got.body, secret="whsec_" + "A" * 32).returncode == 1
    stale = run(got.body, timestamp=str(int(got.headers["webhook-timestamp"]) - 600))
    assert (stale.returncode, stale.stdout) == (1, "stale timestamp\n")
