"""How long to wait before a failed HTTP request is sent again: one rule for the Hub client's transport (hub.py)
and the Binance client (data/binance.py)."""
from __future__ import annotations

import email.utils
import re
import time


def retry_wait(retry_after: str | None, attempt: int, backoff: float) -> float:
    """Seconds to wait after attempt number `attempt` of a request failed transiently: the server's Retry-After
    (seconds, or an HTTP date), else `backoff` doubled on each attempt."""
    if retry_after is not None and re.fullmatch(r"\s*\d+(\.\d*)?\s*", retry_after):
        return float(retry_after)
    try:
        return max(email.utils.parsedate_to_datetime(retry_after).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):  # none, or unreadable: back off
        return backoff * 2 ** (attempt - 1)
