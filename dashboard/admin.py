"""Django admin for the control plane's tables: read-mostly.

Workers write these rows; editing one by hand would bypass the ETag compare-and-set and the audit
log, so nothing can be added or changed here. Deleting is allowed where it is a safe way to purge:
an ownership row (its holder's next renewal fails, it reclaims it as a first claim) and a dead
worker's heartbeat. Operators' actions (drain, pin, rebalance, ...: ``dashboard.control.registry``)
go through the console or their management commands, which record themselves in the audit log shown
here (read-only: an audit log nobody can edit).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import AuditEntry, CheckpointRow, ControlRow, EventLog, LagSample, MemberRow, Ownership

SCOPE_FILTERS = ("namespace", "hub", "consumer_group")


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    deletable = False
    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.deletable and super().has_delete_permission(request, obj)


@admin.register(Ownership)
class OwnershipAdmin(ReadOnly):
    deletable = True
    list_display = ("partition_id", "owner", "modified", "etag", "hub", "consumer_group", "namespace")
    list_filter = (*SCOPE_FILTERS, "owner_id")
    search_fields = ("owner_id", "partition_id", "etag")
    ordering = ("namespace", "hub", "consumer_group", "partition_id")

    @admin.display(description="owner", ordering="owner_id")
    def owner(self, row: Ownership) -> str:
        return row.owner_id or "(released)"

    @admin.display(description="last modified (store clock)", ordering="last_modified")
    def modified(self, row: Ownership) -> str:
        return _when(row.last_modified)


@admin.register(CheckpointRow)
class CheckpointAdmin(ReadOnly):
    list_display = ("partition_id", "sequence_number", "offset", "modified", "hub", "consumer_group", "namespace")
    list_filter = SCOPE_FILTERS
    search_fields = ("partition_id",)
    ordering = ("namespace", "hub", "consumer_group", "partition_id")

    @admin.display(description="last modified (store clock)", ordering="last_modified")
    def modified(self, row: CheckpointRow) -> str:
        return _when(row.last_modified)


@admin.register(MemberRow)
class MemberAdmin(ReadOnly):
    deletable = True
    list_display = ("owner_id", "seen", "hub", "consumer_group", "namespace")
    list_filter = SCOPE_FILTERS
    search_fields = ("owner_id",)
    ordering = ("namespace", "hub", "consumer_group", "owner_id")

    @admin.display(description="last heartbeat (store clock)", ordering="last_seen")
    def seen(self, row: MemberRow) -> str:
        return _when(row.last_seen)


@admin.register(ControlRow)
class ControlAdmin(ReadOnly):
    list_display = ("kind", "target", "value", "since", "hub", "consumer_group", "namespace")
    list_filter = (*SCOPE_FILTERS, "kind")
    search_fields = ("target", "value")
    ordering = ("namespace", "hub", "consumer_group", "kind", "target")

    @admin.display(description="since (store clock)", ordering="created")
    def since(self, row: ControlRow) -> str:
        return _when(row.created)


@admin.register(EventLog)
class EventLogAdmin(ReadOnly):
    list_display = ("id", "kind", "partition_id", "previous_owner", "owner_id", "reporter", "reason", "reported")
    list_filter = (*SCOPE_FILTERS, "kind")
    search_fields = ("partition_id", "owner_id", "previous_owner", "reporter", "reason")
    ordering = ("-id",)

    @admin.display(description="at (reporter's clock)", ordering="at")
    def reported(self, row: EventLog) -> str:
        return _when(row.at)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnly):
    list_display = ("id", "when", "user", "action", "target", "value", "outcome", "reason", "message")
    list_filter = (*SCOPE_FILTERS, "action", "outcome", "user")
    search_fields = ("user", "target", "value", "reason", "message")
    ordering = ("-id",)

    @admin.display(description="at", ordering="at")
    def when(self, row: AuditEntry) -> str:
        return _when(row.at)


@admin.register(LagSample)
class LagSampleAdmin(ReadOnly):
    list_display = ("partition_id", "when", "owner_id", "sequence_number", "lag", "lag_seconds", "status", "hub")
    list_filter = (*SCOPE_FILTERS, "status")
    search_fields = ("partition_id", "owner_id")
    ordering = ("-at", "partition_id")

    @admin.display(description="at (store clock)", ordering="at")
    def when(self, row: LagSample) -> str:
        return _when(row.at)
