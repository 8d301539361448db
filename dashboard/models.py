"""The control plane's tables: the SQL ownership/checkpoint store, workers, controls, event log.

Rows convert to the balancer's frozen records at the edge (``to_domain``), so the ORM stays out of
the core.
"""

from __future__ import annotations

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

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "hub", "consumer_group", "partition_id"], name="one_owner_per_partition"
            )
        ]

    def __str__(self) -> str:
        return f"{self.hub}/{self.consumer_group}/{self.partition_id} -> {self.owner_id or '(released)'}"

    def to_domain(self) -> OwnershipRecord:
        return OwnershipRecord(
            self.ref, self.partition_id, self.owner_id, self.etag, self.last_modified, self.owner_level
        )


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
        )

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "namespace": self.namespace,
            "hub": self.hub,
            "consumer_group": self.consumer_group,
            "partition_id": self.partition_id,
            "owner_id": self.owner_id,
            "previous_owner": self.previous_owner,
            "reporter": self.reporter,
            "reason": self.reason,
            "at": self.at,
        }
