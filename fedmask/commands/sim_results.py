"""What `fedmask simulate` prints and writes when a device-level run ends
(one process, or rank 0 of a distributed run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def report_devices(results: dict[str, Any], out: Path, dp_delta: float) -> None:
    """Write a device-level run's results to `out` and print its done line."""
    from fedmask import console as cli_console

    from models.sim.engine import write_results

    j, p = write_results(results, out)
    t = results["test"]
    if results["kind"] == "explicit":
        line = f"test rmse {t.get('rmse', float('nan')):.4f}  mae {t.get('mae', float('nan')):.4f}"
    else:
        line = (
            f"test hr@10 {t.get('hr@10', float('nan')):.4f}  ndcg@10 {t.get('ndcg@10', float('nan')):.4f}  "
            f"full hr@10 {t.get('full_hr@10', float('nan')):.4f}  placebo hr@10 "
            f"{results['placebo']['hr@10']:.4f}"
        )
    if "epsilon" in results:
        line += f"  epsilon {results['epsilon']:.3g} (delta {dp_delta:g}, no amplification by sampling)"
        if "epsilon_poisson_amplified" in results:
            line += f", {results['epsilon_poisson_amplified']:.3g} if Poisson-sampled"
        if results["dp"]["mechanism"] == "gaussian-float":
            line += ", APPROXIMATE (float noise)"
    line += diverged_note(results)
    if "hybrid" in results:
        h = results["hybrid"]
        line += (f"  UNPROTECTED plaintext share {h['plaintext_share']:.3f} (J <= {h['plaintext_j_bound']:g}, "
                 f"{h['plaintext_contributions']} plaintext contributions)")
    cli_console.out().print(
        f"[green]done[/green] {results['model']} on {results['dataset']}: best round {results['best_round']}, "
        f"{line}, {results['seconds_total']:.1f} s\n  {j}\n  {p}"
        + (f"\n  {results['saved_global']}" if "saved_global" in results else "")
    )


def diverged_note(results: dict[str, Any]) -> str:
    """The done line's warning for a run that stopped at a diverged round ('' otherwise)."""
    r = results.get("diverged_at_round")
    return "" if r is None else f"  [red]DIVERGED at round {r}[/red] (stopped there)"
