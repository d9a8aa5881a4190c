"""Timeouts for every in-flight exchange from one periodic timer.

A per-request `asyncio.timeout` (plus a reschedule per chunk for the idle gap) costs about a
tenth of the proxy's throughput under uvloop. Timeouts here are seconds to minutes long, so a
quarter-second tick is precise enough: each exchange only stores its deadlines, and the tick
cancels the handler task of any exchange past one, marking why so the handler can tell a
timeout from a client that hung up.
"""

from __future__ import annotations

import asyncio
import contextlib

from toolproxy.proxy.flow import Addon, Service


class Watchdog(Addon):
    """An addon for its service only: the handler adds and removes each flow itself."""

    def __init__(self, tick: float = 0.25) -> None:
        self.tick = tick
        self.active: set = set()
        self._task: asyncio.Task | None = None

    def service(self) -> Service:
        return Service("watchdog", self.start, self.stop)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick)
            now = loop.time()
            for ex in list(self.active):
                phase = None
                if ex.deadline is not None and now >= ex.deadline:
                    phase = ex.phase
                elif ex.hard_deadline is not None and now >= ex.hard_deadline:
                    phase = "total"
                if phase is not None and ex.expired is None:
                    ex.expired = phase
                    ex.task.cancel()
