"""What the operator's startup handler sets of kopf's own settings, from
Hooklane's: against a real Postgres, as the handler opens its pool."""

from __future__ import annotations

from dataclasses import replace

import kopf

from hooklane.operator import handlers, kopf_fixes
from hooklane.settings import Settings


async def test_startup_hands_kopf_the_worker_limit_and_the_watch_idle_timeout(settings: Settings):
    config = replace(settings, operator_workers=7, operator_watch_idle_seconds=12.5)
    kopf_settings = kopf.OperatorSettings()
    assert kopf_settings.watching.inactivity_timeout != 12.5
    memo = kopf.Memo()
    memo.config = config
    await handlers.startup(settings=kopf_settings, memo=memo, endpoints={}, secrets={})
    try:
        assert kopf_settings.queueing.worker_limit == 7
        assert kopf_settings.watching.inactivity_timeout == 12.5
        assert kopf_settings.persistence.finalizer == handlers.FINALIZER
        assert isinstance(kopf_settings.persistence.diffbase_storage, kopf_fixes.Essence)
    finally:
        await handlers.cleanup(memo=memo)
