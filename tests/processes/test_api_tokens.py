"""``hooklane api`` refuses to start on a token list that could be read two
ways (issue 18)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hooklane.dev.postgres import free_port
from testsupport.api_tokens import OTHER, TENANT_LIKE_A_TOKEN, TOKEN
from testsupport.fixtures import api_process


@pytest.mark.parametrize("where", ["variable", "file"])
def test_hooklane_api_refuses_to_start_on_a_misread_token_list(tmp_path: Path, where: str) -> None:
    """The issue's configuration: before, `hooklane api` started and took
    `globex-corporation-eu` as a token for every tenant. It is refused
    before any connection to the database, which is not there."""
    entries = f"{TOKEN} acme,{TENANT_LIKE_A_TOKEN}"
    if where == "variable":
        env = {"HOOKLANE_API_TOKENS": entries}
        variable = "HOOKLANE_API_TOKENS"
    else:
        (tmp_path / "tokens").write_text(f"{OTHER}\n{entries}\n")
        env = {"HOOKLANE_API_TOKENS_FILE": str(tmp_path / "tokens")}
        variable = "HOOKLANE_API_TOKENS_FILE"
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane"
    api = api_process(nowhere, free_port(), stderr=subprocess.PIPE, **env)
    try:
        _, raw = api.communicate(timeout=30)
    finally:
        api.kill()
    stderr = raw.decode()
    assert api.returncode == 2, stderr
    line = 1 if where == "variable" else 2
    assert f"hooklane: {variable}: line {line}: only `tenants=t1,t2` may follow a token" in stderr
    assert "`TOKEN t1 t2` as `TOKEN tenants=t1,t2`" in stderr
    assert TOKEN not in stderr and TENANT_LIKE_A_TOKEN not in stderr
    assert "Traceback" not in stderr
