"""docs/receivers.md's shell verification example, run as written against a
real delivery, and refusing it once tampered with."""

from __future__ import annotations

import os
import shutil
import subprocess

from testsupport.fixtures import SECRET
from testsupport.receiver_guide import delivery, guide_block


async def test_the_shell_example_verifies_a_real_delivery(db, start_worker, receiver, tmp_path):
    # hack/setup installs openssl: its absence is a broken setup, not a reason to skip.
    assert shutil.which("openssl"), "openssl is not installed: run hack/setup"
    got = await delivery(db, start_worker, receiver)
    script = tmp_path / "verify.sh"
    script.write_text(guide_block("sh", "openssl dgst"))

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
