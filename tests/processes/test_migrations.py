"""``hooklane migrate`` run concurrently applies each migration once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import asyncpg

from hooklane import store


def _migrate_process(dsn: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLANE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "hooklane.cli", "migrate"],
        env={**env, "HOOKLANE_DATABASE_URL": dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_concurrent_migrate_runs_apply_each_migration_once(fresh_dsn):
    runs = [_migrate_process(fresh_dsn) for _ in range(6)]
    loop = asyncio.get_running_loop()
    outputs = await asyncio.gather(
        *(loop.run_in_executor(None, lambda p=p: p.communicate(timeout=120)) for p in runs)
    )
    assert [p.returncode for p in runs] == [0] * 6, [err for _, err in outputs]
    said = sorted(out.strip() for out, _ in outputs)
    count = len(store.available_migrations())
    assert said == [f"applied {count} migration(s)"] + ["database is up to date"] * 5
    conn = await asyncpg.connect(fresh_dsn)
    try:
        versions = [
            r["version"] for r in await conn.fetch("SELECT version FROM hooklane_migrations ORDER BY 1")
        ]
        assert versions == [m.version for m in store.available_migrations()]
        assert await conn.fetchval("SELECT count(*) FROM hooklane_config") == 1
    finally:
        await conn.close()
