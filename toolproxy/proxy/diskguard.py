"""`--on-disk-full block`: no new exchange is served while the recordings are at the disk budget."""

from __future__ import annotations

from toolproxy.proxy.flow import Addon, Flow
from toolproxy.record.housekeeping import Housekeeper


class DiskBudgetGuard(Addon):
    def __init__(self, housekeeper: Housekeeper) -> None:
        self.housekeeper = housekeeper

    def request_headers(self, flow: Flow) -> None:
        # A plain attribute read: the housekeeping thread measures the disk, never the event loop.
        if self.housekeeper.refusal is not None:
            flow.refuse(503, "disk_budget_full", self.housekeeper.refusal, "recording_unavailable")
