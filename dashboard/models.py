"""The control plane's tables: the SQL ownership/checkpoint store, workers, controls, event log.

Rows convert to the balancer's frozen records at the edge (``to_domain``), so the ORM stays out of
the core.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from balancer.model import BalancerEvent, Checkpoint, Control, ControlKind, HubRef, OwnershipRecord


class Scoped(models.Model):
    """A row of one hub and consumer group."""

    namespace = models.CharField(max_length=255)
    hub = models.CharField(max_length=255)
    consumer_group = models.CharField(max_length=255)

    class Meta:
        abstract = True

    @property
    def ref(self) -> HubRef:
        return HubRef(self.namespace, self.hub, self.consumer_group)

    @classmethod
    def scope(cls, ref: HubRef) -> dict[str, str]:
        return {"namespace": ref.namespace, "hub": ref.hub, "consumer_group": ref.consumer_group}


class Ownership(Scoped):
    """One partition's ownership record. ``etag`` changes on every write; "" owner = released."""

    partition_id = models.CharField(max_length=16)
    owner_id = models.CharField(max_length=255, blank=True)
    etag = models.CharField(max_length=64)
    last_modified = models.FloatField(help_text="store clock, seconds since the epoch")
    owner_level = models.BigIntegerField(default=0)
    # The change number of this row's latest write through the store (``OwnershipClock``); 0 for a
    # row written by hand, which a trigger answers by changing the hub's epoch (migration 0005).
    changed = models.BigIntegerField(default=0, db_default=0)
    # The change number of its latest write through the store that was no renewal (it changed the
    # owner or the owner level): a reader that leaves renewals out reads by it (migration 0006).
    owner_changed = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "hub", "consumer_group", "partition_id"], name="one_owner_per_partition"
            )
        ]
        indexes = [models.Index(fields=["namespace", "hub", "consumer_group", "changed"], name="ownership_changed")]

    def __str__(self) -> str:
        return f"{self.hub}/{self.consumer_group}/{self.partition_id} -> {self.owner_id or '(released)'}"

    def to_domain(self) -> OwnershipRecord:
        return OwnershipRecord(
            self.ref, self.partition_id, self.owner_id, self.etag, self.last_modified, self.owner_level
        )


class OwnershipClock(Scoped):
    """One hub's change numbering for its ownership rows (``balancer.changes``, ``dashboard.sql``): on SQLite
    ``serial`` is the counter every ownership write takes its number from (writers run one at a time
    there); on PostgreSQL a row's number is its writer's transaction id and ``serial`` stays 0.
    ``epoch`` changes when rows are deleted or written by hand (triggers of migration 0005): a
    worker's cursor of another epoch reads everything again."""

    serial = models.BigIntegerField(default=0)
    epoch = models.CharField(max_length=32)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "hub", "consumer_group"], name="one_clock_per_hub")]

    def __str__(self) -> str:
        return f"{self.hub}/{self.consumer_group} change {self.serial} ({self.epoch})"


class CheckpointRow(Scoped):
    """Where processing of one partition resumes."""

    partition_id = models.CharField(max_length=16)
    sequence_number = models.BigIntegerField()
    offset = models.CharField(max_length=64, blank=True, null=True)
    last_modified = models.FloatField(help_text="store clock, seconds since the epoch")

    class Meta:
        verbose_name = "checkpoint"
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "hub", "consumer_group", "partition_id"], name="one_checkpoint_per_partition"
            )
        ]

    def __str__(self) -> str:
        return f"{self.hub}/{self.consumer_group}/{self.partition_id} @ {self.sequence_number}"

    def to_domain(self) -> Checkpoint:
        return Checkpoint(self.ref, self.partition_id, self.sequence_number, self.offset, self.last_modified)


class MemberRow(Scoped):
    """A worker's heartbeat (alive whatever it owns)."""

    owner_id = models.CharField(max_length=255)
    last_seen = models.FloatField(help_text="store clock, seconds since the epoch")
    info = models.JSONField(default=dict, blank=True)
    # The change number of the row's latest write through the store, as ``Ownership.changed``: a
    # worker's steady read lists only the members written since its cursor (migration 0008).
    changed = models.BigIntegerField(default=0, db_default=0, editable=False)

    class Meta:
        verbose_name = "worker"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "hub", "consumer_group", "owner_id"], name="one_member_row")
        ]

    def __str__(self) -> str:
        return self.owner_id


class ControlRow(Scoped):
    """An operator's standing instruction: drain a worker, pin a partition, rebalance now."""

    kind = models.CharField(max_length=16, choices=[(k.value, k.value) for k in ControlKind])
    target = models.CharField(max_length=255)
    value = models.CharField(max_length=255, blank=True)
    created = models.FloatField()
    # As ``MemberRow.changed`` (migration 0008).
    changed = models.BigIntegerField(default=0, db_default=0, editable=False)

    class Meta:
        verbose_name = "control record"
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "hub", "consumer_group", "kind", "target"], name="one_control_per_target"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.target} {self.value}".strip()

    def to_domain(self) -> Control:
        return Control(self.ref, ControlKind(self.kind), self.target, self.value, self.created)


class EventLog(Scoped):
    """Every balancer event any worker reported, in arrival order (``id`` orders the feed)."""

    kind = models.CharField(max_length=16)
    partition_id = models.CharField(max_length=16)
    owner_id = models.CharField(max_length=255, null=True, blank=True)
    previous_owner = models.CharField(max_length=255, null=True, blank=True)
    reporter = models.CharField(max_length=255)
    reason = models.TextField(blank=True)
    at = models.FloatField(help_text="reporter's clock, seconds since the epoch")
    handoff = models.BooleanField(default=False, help_text="a release on a planned handoff, not a shutdown")

    class Meta:
        verbose_name = "balancer event"
        indexes = [models.Index(fields=["namespace", "hub", "consumer_group", "id"])]

    def __str__(self) -> str:
        return f"#{self.id} {self.kind} {self.partition_id} {self.previous_owner or '-'} -> {self.owner_id or '-'}"

    @classmethod
    def from_domain(cls, event: BalancerEvent) -> EventLog:
        return cls(
            **cls.scope(event.ref),
            kind=event.kind.value,
            partition_id=event.partition_id,
            owner_id=event.owner_id,
            previous_owner=event.previous_owner,
            reporter=event.reporter,
            reason=event.reason,
            at=event.at,
            handoff=event.handoff,
        )

    JSON_FIELDS = (
        "id",
        "kind",
        "namespace",
        "hub",
        "consumer_group",
        "partition_id",
        "owner_id",
        "previous_owner",
        "reporter",
        "reason",
        "at",
        "handoff",
    )

    def as_json(self) -> dict[str, object]:
        return self.json_of({name: getattr(self, name) for name in self.JSON_FIELDS})

    @staticmethod
    def json_of(row: dict[str, Any]) -> dict[str, Any]:
        """The feed's JSON for a ``values(*JSON_FIELDS)`` row (no model instance: the websocket's hot path)."""
        row["category"] = category(row["kind"], row["handoff"])
        return row


def category(kind: str, handoff: bool) -> str:
    """What the feed files an event under: its kind, or "handoff" for a planned release."""
    if kind == "release" and handoff:
        return "handoff"
    return kind


class LagSample(Scoped):
    """One partition as one sampling round saw it: checkpoint, lag and status (kept for a bounded time).

    Every partition of a round shares the round's ``at``, so the latest round is one ``at``.
    """

    partition_id = models.CharField(max_length=16)
    at = models.FloatField(help_text="store clock, seconds since the epoch")
    owner_id = models.CharField(max_length=255, blank=True)
    sequence_number = models.BigIntegerField(null=True, blank=True, help_text="checkpointed")
    checkpoint_modified = models.FloatField(null=True, blank=True, help_text="when the checkpoint was written")
    last_enqueued_sequence_number = models.BigIntegerField(null=True, blank=True)
    lag = models.BigIntegerField(null=True, blank=True, help_text="events after the checkpoint")
    lag_seconds = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=8, blank=True)

    class Meta:
        verbose_name = "lag sample"
        indexes = [
            models.Index(fields=["namespace", "hub", "consumer_group", "partition_id", "at"]),
            models.Index(fields=["namespace", "hub", "consumer_group", "at"]),
        ]

    def __str__(self) -> str:
        return f"{self.hub}/{self.partition_id} @ {self.at:.0f}: lag {self.lag} {self.status}"

    def as_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "owner": self.owner_id or None,
            "sequence_number": self.sequence_number,
            "checkpoint_modified": self.checkpoint_modified,
            "last_enqueued_sequence_number": self.last_enqueued_sequence_number,
            "lag": self.lag,
            "lag_seconds": self.lag_seconds,
            "status": self.status or None,
        }


class AuditEntry(Scoped):
    """One operator action, applied or refused: who, when, what, why, outcome."""

    APPLIED, REFUSED, FAILED = "applied", "refused", "failed"

    at = models.FloatField(help_text="dashboard clock, seconds since the epoch")
    user = models.CharField(max_length=255, help_text="username, or cli:<os user> for management commands")
    action = models.CharField(max_length=32)
    target = models.CharField(max_length=255, blank=True)
    value = models.CharField(max_length=255, blank=True)
    reason = models.TextField()
    outcome = models.CharField(max_length=16, choices=[(o, o) for o in (APPLIED, REFUSED, FAILED)])
    message = models.TextField(blank=True, help_text="what happened, or why it was refused")
    detail = models.JSONField(default=dict, blank=True, help_text="the dry run that was confirmed")

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        indexes = [models.Index(fields=["namespace", "hub", "consumer_group", "id"])]

    def __str__(self) -> str:
        return f"#{self.id} {self.user} {self.action} {self.target} {self.value} ({self.outcome})".replace("  ", " ")

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "at": self.at,
            "user": self.user,
            "action": self.action,
            "target": self.target,
            "value": self.value,
            "reason": self.reason,
            "outcome": self.outcome,
            "message": self.message,
            "moves": len(self.detail.get("moves", [])) if isinstance(self.detail, dict) else 0,
        }


class Refusal(models.Model):
    """Attempts refused before they reached an operator's action, counted (``control/refusals.py``):
    per kind (a wrong password, a lockout, an action without a staff login, a missing CSRF token), per
    client address and per account, the account only when it is one (a known user name, or the
    non-staff user who was logged in). Nothing an unauthenticated sender wrote is stored here."""

    kind = models.CharField(max_length=16)
    source = models.CharField(max_length=255, help_text="the client's address as the console saw it")
    user = models.CharField(max_length=150, blank=True, help_text="an existing account, else empty")
    count = models.PositiveBigIntegerField(default=0)
    first_at = models.FloatField(help_text="dashboard clock, seconds since the epoch")
    last_at = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "source", "user"], name="refusal_per_source")]
        indexes = [models.Index(fields=["last_at"])]

    def as_json(self, staff: bool) -> dict[str, object]:
        """The count as a reader sees it: which address and account for staff only."""
        return {
            "kind": self.kind,
            "source": self.source if staff else None,
            "user": self.user if staff else None,
            "count": self.count,
            "first_at": self.first_at,
            "last_at": self.last_at,
        }
