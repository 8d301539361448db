"""Seats at the console's websockets, shared fairly (issue 37): one anonymous client opened all 500
sockets in 5.6 s and the operator's own was refused.

A socket takes a seat before anything starts for it and gives it back when it ends. At most
``LEASEBOARD_SOCKETS_MAX`` seats in all; at most ``LEASEBOARD_SOCKETS_PER_CLIENT`` per client (a
signed-in user counts as one client wherever they connect from, anyone else by their address); and
anonymous readers together leave a tenth of the seats (at least one) to signed-in users, so an
operator always gets a live view. A refused socket is closed with 4503 (try again later) and a
message saying which limit it met.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.conf import settings


def client_of(scope: dict[str, Any]) -> tuple[str, bool]:
    """(the client a socket counts against, whether it is a signed-in user)."""
    user = scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user {user.pk}", True
    address = (scope.get("client") or ["unknown"])[0]
    return f"address {address}", False


class Seats:
    """The seats of this console process."""

    def __init__(self) -> None:
        self.taken = 0
        self.anonymous = 0
        self.by_client: Counter[str] = Counter()

    def take(self, client: str, signed_in: bool) -> str | None:
        """Take a seat for ``client``; None if taken, else why not (nothing is taken then)."""
        most = settings.LEASEBOARD_SOCKETS_MAX
        if self.taken >= most:
            return f"this console serves its maximum of {most} sockets; try later"
        per_client = settings.LEASEBOARD_SOCKETS_PER_CLIENT
        if self.by_client[client] >= per_client:
            return f"at most {per_client} sockets per client; close another page first"
        if not signed_in and self.anonymous >= most - max(1, most // 10):
            return "the sockets left are kept for signed-in users; log in, or try later"
        self.taken += 1
        self.anonymous += 0 if signed_in else 1
        self.by_client[client] += 1
        return None

    def give_back(self, client: str, signed_in: bool) -> None:
        self.taken -= 1
        self.anonymous -= 0 if signed_in else 1
        self.by_client[client] -= 1
        if self.by_client[client] <= 0:
            del self.by_client[client]


SEATS = Seats()
