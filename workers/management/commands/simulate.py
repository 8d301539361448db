"""``manage.py simulate``: one strategy through one scenario on simulated time (``balancer.sim.run``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.sim.run import SCENARIOS, Settings, check, simulate
from balancer.strategies import DEFAULT, NAMES, load_weighted
from workers.progress import progress

DEFAULTS = Settings()


class Command(BaseCommand):
    help = (
        "Runs the real coordinator and strategy code against the in-memory store on a simulated clock "
        "and prints what it measured (one JSON object with --json)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--strategy",
            default=None,
            help=f"one of {', '.join(NAMES)} (default: {DEFAULT}, the project's default)",
        )
        parser.add_argument("--scenario", required=True, help=f"one of {', '.join(SCENARIOS)}")
        parser.add_argument("--partitions", type=int, default=32, help="partitions P (default 32)")
        parser.add_argument("--workers", type=int, default=4, help="workers N (default 4)")
        parser.add_argument("--seeds", type=int, default=20, help="seeded runs 0..K-1 (default 20)")
        parser.add_argument("--interval", type=float, default=DEFAULTS.interval, help="seconds between cycles")
        parser.add_argument("--expiry", type=float, default=DEFAULTS.expiry, help="lease expiry in seconds")
        parser.add_argument(
            "--no-notices",
            action="store_true",
            help="no notices (the Blob store without a channel layer): a released partition waits for its "
            "receiver's next poll, a join or a control for the others' next cycle, and nobody waits quietly",
        )
        parser.add_argument(
            "--load-weighted",
            action="store_true",
            help=f"share by measured events per second ({DEFAULT}'s weighted variant, as runworkers --load-weighted; "
            "see the hot-partition scenario)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        interval, expiry = options["interval"], options["expiry"]
        if not 0 < interval < expiry:
            raise CommandError(f"need 0 < --interval < --expiry, got {interval:g} and {expiry:g}")
        strategy, scenario, seeds = options["strategy"], options["scenario"], options["seeds"]
        try:
            chosen = check(strategy, scenario, options["partitions"], options["workers"], seeds)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # A progress line on a terminal (stderr) only; nothing with --json or when piped.
        if options["load_weighted"]:
            try:
                load_weighted(chosen)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        with progress(f"{chosen.name} / {scenario}", total=seeds, unit="seeds", enabled=not options["json"]) as task:
            result = simulate(
                strategy,
                scenario,
                options["partitions"],
                options["workers"],
                seeds,
                Settings(interval=interval, expiry=expiry, notice_latency=None if options["no_notices"] else 0.005),
                on_seed=lambda _seed: task.advance(),
                weighted=options["load_weighted"],
            )
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(summary(result))


def summary(r: dict[str, Any]) -> str:
    """The result as a few readable lines."""

    def mm(key: str, unit: str = "") -> str:
        value = r[key]
        return "n/a" if value["median"] is None else f"{value['median']:g}{unit} median, {value['max']:g}{unit} max"

    return "\n".join(
        [
            f"{r['strategy']} / {r['scenario']}: {r['partitions']} partitions, {r['workers']} workers, "
            f"{r['seeds']} seeds (interval {r['interval']:g}s, expiry {r['expiry']:g}s)",
            f"  balanced runs      {r['balanced_runs']}/{r['seeds']}",
            f"  cycles to balance  {mm('cycles_to_balance')} (balancing intervals)",
            f"  time to balance    {mm('seconds_to_balance', 's')}",
            f"  reads to balance   {mm('reads_to_balance')} (the most cycles a worker ran, wake-ups included)",
            f"  moves              {mm('moves')} (fewest possible: {r['min_moves']})",
            f"  overlap            {mm('overlap_seconds', 's')}",
            f"  longest unowned    {r['max_unowned_seconds']:g}s",
            f"  requests/cycle     {mm('store_requests_per_worker_cycle')}",
            f"  plan time          {mm('plan_ms', ' ms')}",
            f"  load max/mean      {mm('load_spread')}{' (load-weighted)' if r.get('load_weighted') else ''}",
        ]
    )
