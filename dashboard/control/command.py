"""The admin-action management commands (``drain``, ``pin``, ...), each built from its registry entry:
parse, show the dry run, ask, apply.

``dashboard/management/commands/<name>.py`` is one line, ``Command = command_for("<name>")``: the
arguments, their help and the command's help come from the action's declaration, and the work is
``actions.preview``/``actions.apply``, the same code behind the page's buttons, so both land in the
same audit log. The user recorded is ``cli:<login name>`` (``--user`` overrides it). Without
``--yes`` the command asks before applying; ``--dry-run`` only shows what would move. A refusal
(an unknown worker or partition included) ends the command with exit status 1 and the reason on stderr.
"""

from __future__ import annotations

import asyncio
import getpass
import sys
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.errors import StoreError
from balancer.model import HubRef

from ..live.state import forget_stores, parse_ref
from . import actions
from .action import Action
from .registry import REGISTRY
from .request import Move


class ActionCommand(BaseCommand):
    stealth_options = ("stdin",)  # tests (and scripts calling call_command) hand the answers in
    action: Action

    def add_arguments(self, parser: CommandParser) -> None:
        for name, argument in (("target", self.action.target), ("value", self.action.value)):
            if argument is None:
                continue
            if argument.option:
                parser.add_argument(
                    argument.option, dest=name, required=True, metavar=argument.metavar, help=argument.help
                )
            else:
                parser.add_argument(name, metavar=argument.metavar, help=argument.help)
        if self.action.force:
            parser.add_argument("--force", action="store_true", help=self.action.force)
        parser.add_argument("--reason", default="", help="why (kept in the audit log); asked for when left out")
        parser.add_argument("--yes", action="store_true", help="apply without asking")
        parser.add_argument("--dry-run", action="store_true", help="only show what would change")
        parser.add_argument("--user", default="", help="who to record in the audit log (default: cli:<login>)")
        parser.add_argument("--hub", help="hub (default: LEASEBOARD_HUB)")
        parser.add_argument("--consumer-group", help="consumer group (default: LEASEBOARD_CONSUMER_GROUP)")

    def request(self, options: dict[str, Any]) -> actions.Request:
        try:
            return actions.parse({**options, "action": self.action.name})
        except actions.Refused as refusal:
            raise CommandError(refusal.message) from None

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdin = options.get("stdin") or sys.stdin
        try:
            ref = parse_ref(options["hub"], options["consumer_group"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        asyncio.run(self._run(ref, options))

    async def _run(self, ref: HubRef, options: dict[str, Any]) -> None:
        try:
            await self._act(ref, options)
        except actions.Refused as refusal:
            raise CommandError(refusal.message) from None
        except StoreError as exc:
            raise CommandError(f"store unavailable: {exc}") from exc
        finally:
            await forget_stores()

    async def _act(self, ref: HubRef, options: dict[str, Any]) -> None:
        wanted = self.request(options)
        shown = await actions.preview(ref, wanted)
        self._show(shown)
        if options["dry_run"]:
            return
        reason = wanted.reason or self._ask("Reason (kept in the audit log): ")
        if not reason:
            raise CommandError("a reason is needed: --reason '...'")
        confirm_last = False
        if shown.needs_confirmation:
            if options["yes"]:
                raise CommandError(f"{shown.notes[0]}; run without --yes and confirm by typing the worker's id")
            confirm_last = self._ask(f"Type {wanted.target} to drain the last live worker: ") == wanted.target
            if not confirm_last:
                raise CommandError("not confirmed; nothing was changed")
        elif not options["yes"] and self._ask("Apply? [y/N] ").lower() not in ("y", "yes"):
            self.stdout.write("Nothing was changed.")
            return
        user = options["user"] or f"cli:{getpass.getuser()}"
        entry = await actions.apply(ref, replace(wanted, reason=reason, confirm_last=confirm_last), user)
        self.stdout.write(self.style.SUCCESS(f"Applied (audit #{entry['id']}): {entry['message']}"))

    def _show(self, shown: actions.Preview) -> None:
        self.stdout.write(shown.summary)
        if shown.strategy is not None:
            self.stdout.write(f"  planned with {shown.strategy} ({shown.strategy_basis})")
        for line in move_lines(shown.moves):
            self.stdout.write(f"  {line}")
        if shown.checkpoint is not None:
            c = shown.checkpoint
            self.stdout.write(
                f"  partition {c['partition_id']}: checkpoint {c['from']} -> {c['to']}, "
                f"lag {c['lag_before']} -> {c['lag_after']} events"
            )
        for note in shown.notes:
            self.stdout.write(f"  note: {note}")

    def _ask(self, prompt: str) -> str:
        if self.stdin.isatty():
            self.stdout.write(prompt, ending="")
            self.stdout.flush()
        return str(self.stdin.readline()).strip()


def move_lines(moves: Iterable[Move]) -> list[str]:
    """The printout of a dry run's moves: one line per pair of owners (from -> to), in the order the
    preview lists them, each partition once; the moves that happen anyway are named on their pair's
    line, not listed again under it."""
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    seen: set[str] = set()
    for move in moves:
        if move.partition_id in seen:
            continue
        seen.add(move.partition_id)
        before = move.before or "nobody"
        after = (move.after or "nobody") if move.after_known else "whichever live worker wins the race"
        caused, anyway = groups.setdefault((before, after), ([], []))
        (caused if move.caused else anyway).append(move.partition_id)
    lines = []
    for (before, after), (caused, anyway) in groups.items():
        parts = []
        if caused:
            parts.append(_partitions(caused))
        if anyway:
            parts.append(f"{_partitions(anyway)} already on {'its' if len(anyway) == 1 else 'their'} way")
        lines.append(f"{before} -> {after}: {'; '.join(parts)}")
    return lines


def _partitions(ids: list[str]) -> str:
    return f"partition{'s' if len(ids) != 1 else ''} {', '.join(ids)}"


def command_for(name: str) -> type[ActionCommand]:
    """The management command of the registered action ``name``."""
    action = REGISTRY[name]
    helptext = f"{action.help} Shows what would change first; recorded in the audit log."
    return type("Command", (ActionCommand,), {"action": action, "help": helptext, "__module__": __name__})
